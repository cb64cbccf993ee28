#include "support/test_support.h"
#include "emoe/io/safetensors.h"
TEST(Placeholder, Builds) { SUCCEED(); }

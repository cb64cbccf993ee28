// The plain C interface of libemoe_spm.so, the shim that keeps libsentencepiece out of emoe.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// libsentencepiece bundles protobuf-lite and exports its symbols, which clash with the
// libprotobuf that libtorch loads. So sentencepiece lives in this separate module, loaded with
// dlopen(RTLD_LOCAL | RTLD_DEEPBIND), and only plain C types cross the boundary.
typedef struct emoe_spm emoe_spm;

// Version of this interface; the loader refuses a shim with another one.
#define EMOE_SPM_ABI_VERSION 1
int emoe_spm_abi_version(void);

// A loaded model, or NULL with the reason in emoe_spm_last_error() (per thread).
emoe_spm* emoe_spm_load_file(const char* path);
emoe_spm* emoe_spm_load_serialized(const char* data, size_t size);
void emoe_spm_free(emoe_spm* model);
const char* emoe_spm_last_error(void);

// Encode/decode return 0 on success (the buffer is malloc'ed, release it with
// emoe_spm_free_buffer) or -1 with emoe_spm_last_error() set.
int emoe_spm_encode(const emoe_spm* model, const char* text, size_t size, int** ids, size_t* count);
int emoe_spm_decode(const emoe_spm* model, const int* ids, size_t count, char** text, size_t* size);
void emoe_spm_free_buffer(void* buffer);

int emoe_spm_piece_size(const emoe_spm* model);
// The piece of `id` (NUL-terminated, owned by the model), or NULL when out of range.
const char* emoe_spm_id_to_piece(const emoe_spm* model, int id);
// The id of `piece`, or -1 when the model does not have it (sentencepiece itself says unk).
int emoe_spm_piece_to_id(const emoe_spm* model, const char* piece, size_t size);
float emoe_spm_score(const emoe_spm* model, int id);
// sentencepiece's piece types: 1 normal (or user-defined), 2 unknown, 3 control, 5 unused,
// 6 byte; 0 when out of range.
int emoe_spm_piece_type(const emoe_spm* model, int id);
// The model's own reserved ids (-1 when it has none).
int emoe_spm_unk_id(const emoe_spm* model);
int emoe_spm_bos_id(const emoe_spm* model);
int emoe_spm_eos_id(const emoe_spm* model);
int emoe_spm_pad_id(const emoe_spm* model);

#ifdef __cplusplus
}
#endif

// Text-to-text prompt templates (T0 / FLAN style) for the GLUE classification tasks: a source
// template with {sentence} or {sentence1}/{sentence2}, and one answer string per label id.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "emoe/data/dataset.h"

namespace emoe {

struct PromptTemplate {
  std::string name;                  // e.g. "sst2/review-positive-negative"
  std::string source;                // {sentence}, or {sentence1} and {sentence2} for pairs
  std::vector<std::string> choices;  // the answer text of each label id, in label order
};

// The tasks that have templates (classification only: regression tasks such as stsb have none).
std::vector<std::string> template_task_names();
// A task's templates; InputError (naming `where`) listing the tasks that have templates otherwise.
const std::vector<PromptTemplate>& task_templates(const std::string& task,
                                                  const std::string& where = "templates");
// The source text of an example: {sentence} is texts[0] (also {sentence1}), {sentence2} texts[1].
std::string fill_template(const PromptTemplate& t, const Example& e);

}  // namespace emoe

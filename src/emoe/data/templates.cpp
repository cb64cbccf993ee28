// The prompt templates of every text-to-text task, in one table.
#include "emoe/data/templates.h"

#include <map>

#include "emoe/core/error.h"

namespace emoe {

namespace {

const std::map<std::string, std::vector<PromptTemplate>>& template_table() {
  static const std::map<std::string, std::vector<PromptTemplate>> kTable = {
      {"sst2",
       {{"sst2/review",
         "Review: {sentence} Is this review positive or negative?",
         {"negative", "positive"}},
        {"sst2/sentiment",
         "{sentence} What is the sentiment of this sentence?",
         {"negative", "positive"}},
        {"sst2/feel",
         "Someone wrote: \"{sentence}\" Did they feel good or bad about it?",
         {"bad", "good"}}}},
      {"cola",
       {{"cola/acceptable",
         "Sentence: {sentence} Is this sentence grammatically acceptable?",
         {"no", "yes"}},
        {"cola/correct", "Is the following sentence correct English? {sentence}", {"no", "yes"}},
        {"cola/linguist",
         "{sentence} Would a linguist rate this sentence as acceptable or unacceptable?",
         {"unacceptable", "acceptable"}}}},
      {"mrpc",
       {{"mrpc/paraphrase",
         "Sentence 1: {sentence1} Sentence 2: {sentence2} Do these two sentences mean the same "
         "thing?",
         {"no", "yes"}},
        {"mrpc/equivalent",
         "\"{sentence1}\" and \"{sentence2}\" Are these sentences equivalent?",
         {"no", "yes"}},
        {"mrpc/rephrase", "Is \"{sentence2}\" a paraphrase of \"{sentence1}\"?", {"no", "yes"}}}},
      {"qnli",
       {{"qnli/answer",
         "Question: {sentence1} Sentence: {sentence2} Does the sentence answer the question?",
         {"yes", "no"}},
        {"qnli/contains",
         "Can the question \"{sentence1}\" be answered by \"{sentence2}\"?",
         {"yes", "no"}},
        {"qnli/context",
         "{sentence2} Does this contain the answer to: {sentence1}?",
         {"yes", "no"}}}},
      {"rte",
       {{"rte/entail", "{sentence1} Does this mean that \"{sentence2}\" is true?", {"yes", "no"}},
        {"rte/premise",
         "Premise: {sentence1} Hypothesis: {sentence2} Does the premise entail the hypothesis?",
         {"yes", "no"}},
        {"rte/follows", "Given that {sentence1} Does it follow that {sentence2}?", {"yes", "no"}}}},
      {"mnli",
       {{"mnli/entail",
         "Premise: {sentence1} Hypothesis: {sentence2} Does the premise entail the hypothesis?",
         {"yes", "maybe", "no"}},
        {"mnli/true",
         "{sentence1} Based on that, is it true that \"{sentence2}\"? Yes, no, or maybe?",
         {"yes", "maybe", "no"}},
        {"mnli/guaranteed",
         "Given {sentence1} Is it guaranteed, possible, or impossible that {sentence2}?",
         {"guaranteed", "possible", "impossible"}}}},
  };
  return kTable;
}

void replace_all(std::string& s, const std::string& key, const std::string& value) {
  for (size_t pos = s.find(key); pos != std::string::npos; pos = s.find(key, pos + value.size()))
    s.replace(pos, key.size(), value);
}

}  // namespace

std::vector<std::string> template_task_names() {
  std::vector<std::string> out;
  for (const auto& [name, t] : template_table()) out.push_back(name);
  return out;
}

const std::vector<PromptTemplate>& task_templates(const std::string& task,
                                                  const std::string& where) {
  const auto& table = template_table();
  auto it = table.find(task);
  EMOE_CHECK(it != table.end(), InputError,
             "{}: no text-to-text templates for task '{}' (tasks with templates: {})", where, task,
             fmt::join(template_task_names(), ", "));
  return it->second;
}

std::string fill_template(const PromptTemplate& t, const Example& e) {
  EMOE_CHECK(!e.texts.empty(), InputError, "template {}: the example has no text", t.name);
  const bool pair = t.source.find("{sentence2}") != std::string::npos;
  EMOE_CHECK(!pair || e.texts.size() >= 2, InputError,
             "template {}: expects a sentence pair, the example has {} text(s)", t.name,
             e.texts.size());
  std::string s = t.source;
  replace_all(s, "{sentence1}", e.texts[0]);
  replace_all(s, "{sentence2}", pair ? e.texts[1] : std::string());
  replace_all(s, "{sentence}", e.texts[0]);
  return s;
}

}  // namespace emoe

// Datasets: GLUE task registry, out-of-domain sets, generic TSV/CSV/JSONL tables, Alpaca, MMLU.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace emoe {

// What a classification / regression task is: its labels and how it is scored.
struct TaskSpec {
  std::string name;                  // "sst2", "cola", ... or a user-given name
  bool regression = false;           // STS-B
  std::vector<std::string> labels;   // label names in id order (empty for regression)
  std::vector<std::string> metrics;  // e.g. {"accuracy", "f1"}; names as in eval/metrics.h
  std::string main_metric;           // the one that selects the best epoch
  int64_t num_labels() const { return regression ? 1 : static_cast<int64_t>(labels.size()); }
};

struct Example {
  std::vector<std::string> texts;  // one sentence, or a pair
  double label = 0;                // class id, or the regression target
  bool has_label = true;           // false for unlabelled test splits
};

struct Dataset {
  TaskSpec task;
  std::string name;    // e.g. "sst2/dev", "sst2-ood/imdb"
  std::string source;  // the file it was read from
  std::vector<Example> examples;
  // Only for a set with fewer classes than its task's model: the label id to score for each of
  // the model's class ids, e.g. an MNLI model on HANS {0, 1, 1} (entailment stays 0, neutral and
  // contradiction both mean not-entailment, the set's label 1). Empty: predictions are label ids.
  std::vector<int64_t> prediction_labels;
};

// The GLUE registry: cola, sst2, mrpc, qqp, stsb, mnli, mnli-mm, qnli, rte, wnli.
std::vector<std::string> glue_task_names();
TaskSpec glue_task(const std::string& name);  // UsageError listing the names otherwise
// Reads a split ("train", "dev", "test") of a GLUE task from `data_root` (the folder holding
// glue/, ood/, ... such as ../shared/data), in the official TSV layout of each task.
// InputError naming the file when it is missing or malformed.
Dataset load_glue(const std::string& task, const std::string& split, const std::string& data_root);

// Out-of-domain evaluation sets attached to a task (the GLUE-X pairs of SPEC §4 and the other
// sets in data_root/ood): their names, and one set read with the task's label ids.
std::vector<std::string> ood_set_names(const std::string& task);
Dataset load_ood(const std::string& task, const std::string& set, const std::string& data_root);

// A generic table: TSV, CSV (RFC 4180 quoting, multi-line fields) or JSONL, with column mapping.
struct TableSpec {
  std::string path;
  std::string format;                  // "tsv", "csv", "jsonl" ("" = by extension)
  std::vector<std::string> text_cols;  // one or two column names (or 0-based indices as text)
  std::string label_col;               // name or index; "" = unlabelled
  bool header = true;                  // TSV/CSV: the first row names the columns
  bool quoted = true;                  // TSV: honour CSV-style quotes (GLUE's own TSVs do not)
  // Label names -> ids; empty: labels are integers already (or floats for regression).
  std::map<std::string, int64_t> label_map;
};
Dataset load_table(const TableSpec& spec, const TaskSpec& task);

// Alpaca instruction data: [{"instruction", "input", "output"}, ...].
struct InstructionExample {
  std::string instruction, input, output;
};
std::vector<InstructionExample> load_alpaca(const std::string& path);
// The Alpaca prompt template (with or without an input), ending in "### Response:\n".
std::string alpaca_prompt(const InstructionExample& e);

// MMLU-format CSV rows: question, four options, answer letter (no header).
struct MultipleChoiceExample {
  std::string subject;
  std::string question;
  std::vector<std::string> choices;  // 4
  int64_t answer = 0;                // 0..3
};
std::vector<MultipleChoiceExample> load_mmlu_csv(const std::string& path,
                                                 const std::string& subject);
// All subjects of a split folder (e.g. data_root/instruct/mmlu/data/val), sorted by subject.
std::vector<MultipleChoiceExample> load_mmlu_split(const std::string& dir);
// MMLU's prompt: "The following are multiple choice questions (with answers) about <subject>.\n\n"
// + k solved shots + the question with options "A. ..." and a final "Answer:".
std::string mmlu_prompt(const MultipleChoiceExample& q,
                        const std::vector<MultipleChoiceExample>& shots);

}  // namespace emoe

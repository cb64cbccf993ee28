// The GLUE registry (labels, metrics) and readers for each task's official TSV layout.
#include <filesystem>

#include "emoe/core/error.h"
#include "emoe/data/dataset.h"
#include "emoe/data/text_table.h"

namespace emoe {

namespace {

// Label names in id order follow the Hugging Face `glue` dataset, so checkpoints fine-tuned
// elsewhere keep their meaning (RTE/QNLI: entailment 0; WNLI is the other way round).
struct GlueTaskInfo {
  const char* name;
  const char* folder;  // under data_root/glue
  bool regression;
  std::vector<std::string> labels;
  std::vector<std::string> metrics;
  const char* main_metric;
};

const std::vector<GlueTaskInfo>& glue_registry() {
  // Every metric of a task is reported; a task with several (MRPC and QQP: accuracy and F1, STS-B:
  // Pearson and Spearman) is selected and tabled by their mean ("mean"), as the authors'
  // search_glue_no_trainer.py does (average_metric over the GLUE metric's outputs).
  static const std::vector<GlueTaskInfo> tasks = {
      {"cola", "CoLA", false, {"unacceptable", "acceptable"}, {"mcc"}, "mcc"},
      {"sst2", "SST-2", false, {"negative", "positive"}, {"accuracy"}, "accuracy"},
      {"mrpc", "MRPC", false, {"not_equivalent", "equivalent"}, {"accuracy", "f1"}, "mean"},
      {"qqp", "QQP", false, {"not_duplicate", "duplicate"}, {"accuracy", "f1"}, "mean"},
      {"stsb", "STS-B", true, {}, {"pearson", "spearman"}, "mean"},
      {"mnli", "MNLI", false, {"entailment", "neutral", "contradiction"}, {"accuracy"}, "accuracy"},
      {"mnli-mm",
       "MNLI",
       false,
       {"entailment", "neutral", "contradiction"},
       {"accuracy"},
       "accuracy"},
      {"qnli", "QNLI", false, {"entailment", "not_entailment"}, {"accuracy"}, "accuracy"},
      {"rte", "RTE", false, {"entailment", "not_entailment"}, {"accuracy"}, "accuracy"},
      {"wnli", "WNLI", false, {"not_entailment", "entailment"}, {"accuracy"}, "accuracy"},
  };
  return tasks;
}

const GlueTaskInfo& glue_info(const std::string& name) {
  for (const auto& t : glue_registry())
    if (name == t.name) return t;
  std::string names;
  for (const auto& t : glue_registry()) names += (names.empty() ? "" : ", ") + std::string(t.name);
  EMOE_THROW(UsageError, "unknown GLUE task '{}' (tasks: {})", name, names);
}

// Where a split lives and how its columns are laid out. The first candidate file is the official
// GLUE name; later ones are the layouts of the original distributions (CoLA's raw/ folder) and the
// unlabelled test copies of ../shared/data. A candidate "a.tsv+b.tsv" is the two files one after
// the other (both must exist).
struct GlueFile {
  std::vector<std::string> candidates;  // relative to glue/<folder>/
  bool header = true;
  std::vector<std::string> text_cols;  // header names, or indices without a header
  std::string label_col;
};

GlueFile glue_file(const std::string& task, const std::string& split) {
  const bool train = split == "train", dev = split == "dev", test = split == "test";
  auto plain = [&](std::vector<std::string> text, std::string label) {
    GlueFile f;
    f.candidates = {split + ".tsv"};
    if (test) f.candidates.push_back("test_unlabeled.tsv");
    f.text_cols = std::move(text);
    f.label_col = std::move(label);
    return f;
  };
  if (task == "cola") {
    // train/dev: no header; source, label, original mark, sentence. test: index, sentence.
    // The official dev.tsv (1043 sentences, what GLUE and the authors' scripts evaluate) is
    // in_domain_dev (527) followed by out_of_domain_dev (516); the latter is also an
    // out-of-domain set of its own (load_ood("cola", "out_of_domain_dev")), and dev_in_domain is
    // the first half alone.
    if (test) return {{"test.tsv", "glue_test_unlabeled.tsv"}, true, {"sentence"}, "label"};
    if (train) return {{"train.tsv", "raw/in_domain_train.tsv"}, false, {"3"}, "1"};
    if (dev)
      return {{"dev.tsv", "raw/in_domain_dev.tsv+raw/out_of_domain_dev.tsv"}, false, {"3"}, "1"};
    if (split == "dev_in_domain") return {{"raw/in_domain_dev.tsv"}, false, {"3"}, "1"};
  }
  if (task == "sst2" && (train || dev || test)) return plain({"sentence"}, "label");
  if (task == "mrpc" && (train || dev || test)) return plain({"#1 String", "#2 String"}, "Quality");
  if (task == "qqp" && (train || dev || test))
    return plain({"question1", "question2"}, "is_duplicate");
  if (task == "stsb" && (train || dev || test)) return plain({"sentence1", "sentence2"}, "score");
  if (task == "qnli" && (train || dev || test)) return plain({"question", "sentence"}, "label");
  if ((task == "rte" || task == "wnli") && (train || dev || test))
    return plain({"sentence1", "sentence2"}, "label");
  if (task == "mnli" || task == "mnli-mm") {
    const std::string which = task == "mnli" ? "matched" : "mismatched";
    GlueFile f;
    f.text_cols = {"sentence1", "sentence2"};
    f.label_col = "gold_label";
    if (train) f.candidates = {"train.tsv"};
    if (dev) f.candidates = {"dev_" + which + ".tsv"};
    if (test) f.candidates = {"test_" + which + ".tsv"};
    // TextFooler's 1,000-pair samples of the dev sets: no header; label word, premise, hypothesis.
    if (split == "dev_textfooler")
      f = {{"textfooler_1k/mnli_" + which + ".tsv"}, false, {"1", "2"}, "0"};
    if (!f.candidates.empty()) return f;
  }
  const bool nli = task == "mnli" || task == "mnli-mm";
  EMOE_THROW(UsageError, "GLUE task {}: unknown split '{}' (splits: train, dev, test{})", task,
             split,
             nli              ? ", dev_hard, dev_textfooler"
             : task == "cola" ? ", dev_in_domain"
                              : "");
}

// The files of the first candidate whose files all exist (one, or the parts of "a+b").
std::vector<std::string> glue_first_existing(const std::string& dir,
                                             const std::vector<std::string>& names,
                                             const std::string& task, const std::string& split) {
  std::string also;
  for (const auto& n : names) {
    std::vector<std::string> parts;
    bool all = true;
    for (size_t b = 0; b <= n.size();) {
      size_t e = n.find('+', b);
      if (e == std::string::npos) e = n.size();
      parts.push_back(dir + "/" + n.substr(b, e - b));
      all = all && std::filesystem::is_regular_file(parts.back());
      b = e + 1;
    }
    if (all) return parts;
    if (&n != &names.front())
      also += (also.empty() ? "" : ", ") + fmt::format("{}", fmt::join(parts, " + "));
  }
  EMOE_THROW(InputError, "{}/{}: not found (GLUE task {}, split {}{})", dir, names.front(), task,
             split, also.empty() ? "" : "; also looked for " + also);
}

// The "hard" subsets of MNLI dev (Gururangan et al. 2018, as robust-nli ships them): three
// line-aligned files s1.test (premise), s2.test (hypothesis) and labels.test (label words).
Dataset glue_load_mnli_hard(const TaskSpec& task, const std::string& dir) {
  const std::string sub =
      dir + (task.name == "mnli" ? "/hard_subsets/MNLIMatchedHardWithHardTest"
                                 : "/hard_subsets/MNLIMismatchedHardWithHardTest");
  const std::string labels_path = sub + "/labels.test";
  glue_first_existing(sub, {"labels.test"}, task.name, "dev_hard");  // a clear error when absent
  auto s1 = read_lines(sub + "/s1.test");
  auto s2 = read_lines(sub + "/s2.test");
  auto labels = read_lines(labels_path);
  EMOE_CHECK(s1.size() == labels.size() && s2.size() == labels.size(), InputError,
             "{}: {} lines, but s1.test has {} and s2.test {} (the three files are line-aligned)",
             labels_path, labels.size(), s1.size(), s2.size());
  Dataset d;
  d.task = task;
  d.name = task.name + "/dev_hard";
  d.source = labels_path;
  for (size_t i = 0; i < labels.size(); ++i) {
    Example e;
    e.texts = {s1[i], s2[i]};
    e.label = parse_label(labels[i], task, {}, labels_path, static_cast<int64_t>(i) + 1);
    d.examples.push_back(std::move(e));
  }
  return d;
}

}  // namespace

std::vector<std::string> glue_task_names() {
  std::vector<std::string> names;
  for (const auto& t : glue_registry()) names.push_back(t.name);
  return names;
}

TaskSpec glue_task(const std::string& name) {
  const GlueTaskInfo& info = glue_info(name);
  TaskSpec t;
  t.name = info.name;
  t.regression = info.regression;
  t.labels = info.labels;
  t.metrics = info.metrics;
  t.main_metric = info.main_metric;
  return t;
}

Dataset load_glue(const std::string& task, const std::string& split, const std::string& data_root) {
  const TaskSpec spec = glue_task(task);
  const std::string dir = data_root + "/glue/" + glue_info(task).folder;
  if ((task == "mnli" || task == "mnli-mm") && split == "dev_hard")
    return glue_load_mnli_hard(spec, dir);
  const GlueFile layout = glue_file(task, split);
  const std::vector<std::string> paths = glue_first_existing(dir, layout.candidates, task, split);
  Dataset d;
  d.task = spec;
  d.name = task + "/" + split;
  d.source = fmt::format("{}", fmt::join(paths, " + "));
  for (const auto& path : paths) {
    // GLUE's TSVs are written without quoting: texts hold bare double quotes (MRPC, MNLI, QQP).
    TextTable table = read_delimited(path, '\t', false, layout.header);
    std::vector<size_t> text_idx;
    for (const auto& c : layout.text_cols) text_idx.push_back(resolve_column(table, c));
    // Test splits come without labels; everywhere else a missing label column is an error.
    bool labelled = true;
    if (split == "test") {
      labelled = false;
      for (const auto& c : table.columns) labelled = labelled || c == layout.label_col;
    }
    const size_t label_idx = labelled ? resolve_column(table, layout.label_col) : 0;
    d.examples.reserve(d.examples.size() + table.rows.size());
    for (const auto& row : table.rows) {
      Example e;
      for (size_t c : text_idx) e.texts.push_back(row.fields[c]);
      e.has_label = labelled;
      if (labelled) e.label = parse_label(row.fields[label_idx], spec, {}, path, row.line);
      d.examples.push_back(std::move(e));
    }
  }
  return d;
}

}  // namespace emoe

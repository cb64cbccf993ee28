// Out-of-domain evaluation sets of each GLUE task (GLUE-X pairs, TextFooler, SNLI, AdvGLUE).
#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "emoe/core/error.h"
#include "emoe/core/json_depth.h"
#include "emoe/data/dataset.h"
#include "emoe/data/text_table.h"

namespace emoe {

namespace {

enum class OodFormat {
  kGlueX,                // ood/glue_x_human_annotated/tsv_DERIVED: header, CSV-style quoting
  kTextFoolerSentiment,  // "<0|1> <text>" per line
  kTextFoolerNli,        // "<label word>\t<premise>\t<hypothesis>", no header
  kSnliJsonl,            // SNLI fields: sentence1, sentence2, gold_label (a word, "-" = no gold)
  kAdvGlue,              // dev.json: {task: [{..., "label": id}]}, ids as in GLUE
  kColaRaw,              // CoLA raw TSV: source, label, original mark, sentence; no header
};

// The label space of a set's own codes. NLI sets are converted to the task's space (ood_label).
enum class OodLabels {
  kSame,      // the task's ids already (sentiment, acceptability, paraphrase, AdvGLUE)
  kNli3,      // entailment 0, neutral 1, contradiction 2 (GLUE-X MNLI/SNLI/SICK codes, MNLI ids)
  kNli2,      // entailment 0, not_entailment 1 (GLUE-X HANS, SciTail, NewsQA codes)
  kNliWords,  // "entailment" / "neutral" / "contradiction"
  kScore,     // a similarity score (regression)
};

struct OodSet {
  std::string name;
  OodFormat format;
  std::string file;  // relative to data_root
  std::vector<std::string> text_cols;
  std::string label_col;
  OodLabels labels;
};

// The GLUE-X derived TSVs carry two annotators' columns: label_col_B (which agrees best with gold,
// PROVENANCE.md §3) or, in the plain sheets (flipkart, scitail, twitter), "label（Z）".
const std::string kGlueXLabelB = "label_col_B";
const std::string kGlueXLabelZ = "label\xEF\xBC\x88Z\xEF\xBC\x89";  // full-width parentheses

OodSet ood_gluex(const std::string& name, const std::string& file,
                 std::vector<std::string> text_cols, const std::string& label_col,
                 OodLabels labels) {
  return {name,
          OodFormat::kGlueX,
          "ood/glue_x_human_annotated/tsv_DERIVED/" + file,
          std::move(text_cols),
          label_col,
          labels};
}

// AdvGLUE keeps each task's GLUE field names and label ids; `key` is the task's list in dev.json.
OodSet ood_advglue(const std::string& key, std::vector<std::string> text_cols) {
  return {"advglue", OodFormat::kAdvGlue, "ood/advglue/dev.json", std::move(text_cols),
          key,       OodLabels::kSame};
}

OodSet ood_textfooler_sentiment(const std::string& name, const std::string& file) {
  return {name,
          OodFormat::kTextFoolerSentiment,
          "ood/sentiment/textfooler/" + file,
          {},
          "",
          OodLabels::kSame};
}

std::vector<OodSet> ood_nli_sets(const std::string& task) {
  const std::vector<std::string> premise = {"premise", "hypothesis"};
  std::vector<OodSet> sets = {
      ood_gluex("mnli-mismatched", "mnli_ood__mnli-mismatched.tsv", premise, kGlueXLabelB,
                OodLabels::kNli3),
      ood_gluex("snli", "mnli_ood__snli.tsv", premise, kGlueXLabelB, OodLabels::kNli3),
      ood_gluex("sick", "mnli_ood__sick.tsv", {"sentence_A", "sentence_B"}, kGlueXLabelB,
                OodLabels::kNli3),
      // SciTail codes: 0 entails, 1 neutral ("The temperature remains constant until the phase
      // change is complete." / "During phase change, the temperature of a system remains
      // constant." is 0; unrelated pairs are 1).
      ood_gluex("scitail", "sampled_scitail__Sheet1.tsv", {"sentence1", "sentence2"}, kGlueXLabelZ,
                OodLabels::kNli2),
      ood_gluex("hans", "textual_entailment__hans.tsv", premise, kGlueXLabelB, OodLabels::kNli2),
      {"snli-hard",
       OodFormat::kSnliJsonl,
       "ood/nli/snli_1.0_test_hard.jsonl",
       {"sentence1", "sentence2"},
       "gold_label",
       OodLabels::kNliWords},
      {"textfooler-snli",
       OodFormat::kTextFoolerNli,
       "ood/nli/textfooler_snli_1k.tsv",
       {"1", "2"},
       "0",
       OodLabels::kNliWords},
  };
  if (task == "qnli") {
    // NewsQA questions with sentences: GLUE-X's out-of-domain set for QNLI.
    sets.push_back(ood_gluex("newsqa", "qnli_ood__qnli.tsv", {"question", "sentence"}, kGlueXLabelB,
                             OodLabels::kNli2));
    sets.push_back(ood_advglue(task, {"question", "sentence"}));
  } else if (task == "rte") {
    sets.push_back(ood_advglue(task, {"sentence1", "sentence2"}));
  } else {
    sets.push_back(ood_advglue(task, premise));  // "mnli" or "mnli-mm"
  }
  return sets;
}

// Every task's sets (SPEC §4's GLUE-X pairs first, then the other sets of data_root/ood).
std::vector<OodSet> ood_sets(const std::string& task) {
  if (task == "sst2")
    return {
        // GLUE-X sentiment sheets: 1 positive, 0 negative. Flipkart's text is "sentence" (the
        // review; "Review" holds its short title). TextFooler files: 0 negative, 1 positive.
        ood_gluex("imdb", "SA_12.7__imdb.tsv", {"text"}, kGlueXLabelB, OodLabels::kSame),
        ood_gluex("yelp", "SA_12.7__yelp.tsv", {"text"}, kGlueXLabelB, OodLabels::kSame),
        ood_gluex("amazon", "SA_12.7__amazon.tsv", {"content"}, kGlueXLabelB, OodLabels::kSame),
        ood_gluex("flipkart", "sampled_flipkart__Sheet1.tsv", {"sentence"}, kGlueXLabelZ,
                  OodLabels::kSame),
        ood_textfooler_sentiment("textfooler-imdb", "imdb_1k.txt"),
        ood_textfooler_sentiment("textfooler-yelp", "yelp_1k.txt"),
        ood_textfooler_sentiment("textfooler-mr", "mr_1k.txt"),
        ood_advglue("sst2", {"sentence"}),
    };
  if (task == "cola")
    return {
        // GLUE-X "Grammar Test" sheet: 1 acceptable, 0 unacceptable, as CoLA.
        ood_gluex("grammar", "cola_ood_12.9__cola.tsv", {"sentence"}, kGlueXLabelB,
                  OodLabels::kSame),
        {"out_of_domain_dev",
         OodFormat::kColaRaw,
         "glue/CoLA/raw/out_of_domain_dev.tsv",
         {"3"},
         "1",
         OodLabels::kSame},
    };
  if (task == "mnli" || task == "mnli-mm" || task == "qnli" || task == "rte")
    return ood_nli_sets(task);
  // Paraphrase sets: 1 = duplicate / paraphrase, as QQP and MRPC count.
  const OodSet twitter = ood_gluex("twitter", "sampled_twitter__Sheet1.tsv",
                                   {"sentence1", "sentence2"}, kGlueXLabelZ, OodLabels::kSame);
  if (task == "qqp") return {twitter, ood_advglue("qqp", {"question1", "question2"})};
  if (task == "mrpc")
    return {ood_gluex("qqp", "textual_entailment__qqp.tsv", {"question1", "question2"},
                      kGlueXLabelB, OodLabels::kSame),
            twitter};
  if (task == "stsb")
    // SICK pairs scored by GLUE-X's annotators on 0-4 (STS-B uses 0-5); Pearson and Spearman
    // do not depend on the scale, so the scores are kept as they are.
    return {ood_gluex("sick", "stsb_ood__stsb.tsv", {"sentence_A", "sentence_B"}, kGlueXLabelB,
                      OodLabels::kScore)};
  return {};  // wnli
}

int64_t ood_nli_word(const std::string& word, const std::string& path, int64_t line) {
  if (word == "entailment") return 0;
  if (word == "neutral") return 1;
  if (word == "contradiction") return 2;
  EMOE_THROW(InputError, "{}:{}: label '{}': expected entailment, neutral or contradiction", path,
             line, word);
}

// Converts a set's own label code into the task's label id.
//  - 3-way source, 2-way task (QNLI, RTE): entailment 0 -> entailment 0; neutral 1 and
//    contradiction 2 -> not_entailment 1.
//  - 3-way source, MNLI: the ids are MNLI's (entailment 0, neutral 1, contradiction 2).
//  - 2-way source, 2-way task: entailment 0, not_entailment 1, the same ids.
//  - 2-way source, MNLI: the label stays 0 / 1 (= not-entailment) and the Dataset says, through
//    prediction_labels {0, 1, 1}, that the model's neutral and contradiction both score as 1.
double ood_label(const OodSet& set, const TaskSpec& task, const std::string& code,
                 const std::string& path, int64_t line) {
  if (set.labels == OodLabels::kScore || set.labels == OodLabels::kSame)
    return parse_label(code, task, {}, path, line);
  int64_t id = 0;
  if (set.labels == OodLabels::kNliWords) {
    id = ood_nli_word(code, path, line);
  } else {
    TaskSpec source;
    source.name = set.name;
    source.labels = set.labels == OodLabels::kNli2
                        ? std::vector<std::string>{"entailment", "not_entailment"}
                        : std::vector<std::string>{"entailment", "neutral", "contradiction"};
    id = static_cast<int64_t>(parse_label(code, source, {}, path, line));
  }
  if (set.labels == OodLabels::kNli2 || task.num_labels() == 3) return static_cast<double>(id);
  return id == 0 ? 0.0 : 1.0;
}

// GLUE-X rows: annotators left some labels empty, and the sentiment sheets use -1 / -2 for "could
// not tell" (neither polarity); such rows have no label in the task's space and are skipped.
bool ood_gluex_unlabelled(const std::string& code) {
  return code.empty() || code == "-1" || code == "-2";
}

// A TextFooler sentiment text that is one CSV-quoted field (most Yelp lines) loses its quoting;
// other texts (IMDB reviews that merely start and end with a quotation) stay as they are, and so
// do the upstream escapes (\n, \u00e9, \( ...), which TextFooler reads as text too.
std::string ood_unquote(const std::string& text) {
  if (text.size() < 2 || text.front() != '"' || text.back() != '"') return text;
  std::string out;
  const size_t close = text.size() - 1;
  for (size_t i = 1; i < close; ++i) {
    if (text[i] == '"') {
      if (i + 1 < close && text[i + 1] == '"') {
        out += '"';
        ++i;
        continue;
      }
      return text;  // a bare quote inside: not one quoted field
    }
    out += text[i];
  }
  return out;
}

void ood_load_table(const OodSet& set, const TextTable& table, const TaskSpec& task, Dataset& d) {
  std::vector<size_t> text_idx;
  for (const auto& c : set.text_cols) text_idx.push_back(resolve_column(table, c));
  const size_t label_idx = resolve_column(table, set.label_col);
  for (const auto& row : table.rows) {
    const std::string& code = table_field(table, row, label_idx);
    if (set.format == OodFormat::kGlueX && ood_gluex_unlabelled(code)) continue;
    if (set.format == OodFormat::kSnliJsonl && code == "-") continue;  // SNLI: no gold label
    Example e;
    for (size_t c : text_idx) e.texts.push_back(table_text(table, row, c));
    e.label = ood_label(set, task, code, table.path, row.line);
    d.examples.push_back(std::move(e));
  }
}

void ood_load_textfooler_sentiment(const std::string& path, const TaskSpec& task, Dataset& d) {
  const std::vector<std::string> lines = read_lines(path);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const auto line = static_cast<int64_t>(i) + 1;
    if (l.empty()) continue;
    const size_t space = l.find(' ');
    EMOE_CHECK(space != std::string::npos, InputError,
               "{}:{}: expected '<label> <text>', found no space", path, line);
    Example e;
    e.label = parse_label(l.substr(0, space), task, {}, path, line);
    e.texts = {ood_unquote(l.substr(space + 1))};
    d.examples.push_back(std::move(e));
  }
}

void ood_load_advglue(const OodSet& set, const std::string& path, const TaskSpec& task,
                      Dataset& d) {
  nlohmann::json root;
  try {
    root = parse_json_limited(path, read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    EMOE_THROW(InputError, "{}: invalid JSON: {}", path, e.what());
  }
  const std::string& key = set.label_col;
  EMOE_CHECK(root.is_object() && root.contains(key) && root[key].is_array(), InputError,
             "{}: expected an object with a list under '{}'", path, key);
  int64_t index = 0;
  for (const auto& item : root[key]) {
    const std::string where = fmt::format("{}: {}[{}]", path, key, index);
    EMOE_CHECK(item.is_object(), InputError, "{}: expected an object", where);
    Example e;
    for (const auto& col : set.text_cols) {
      EMOE_CHECK(item.contains(col) && item[col].is_string(), InputError,
                 "{}: field '{}': expected a string", where, col);
      e.texts.push_back(item[col].get<std::string>());
    }
    EMOE_CHECK(item.contains("label"), InputError, "{}: field 'label' missing", where);
    const auto& label = item["label"];
    e.label = parse_label(label.is_string() ? label.get<std::string>() : label.dump(), task, {},
                          fmt::format("{}: {}", path, key), index);
    d.examples.push_back(std::move(e));
    ++index;
  }
}

}  // namespace

std::vector<std::string> ood_set_names(const std::string& task) {
  glue_task(task);  // UsageError for an unknown task
  std::vector<std::string> names;
  for (const auto& s : ood_sets(task)) names.push_back(s.name);
  return names;
}

Dataset load_ood(const std::string& task, const std::string& set, const std::string& data_root) {
  const TaskSpec spec = glue_task(task);
  const auto sets = ood_sets(task);
  auto it = std::find_if(sets.begin(), sets.end(), [&](const OodSet& s) { return s.name == set; });
  if (it == sets.end()) {
    std::string names;
    for (const auto& s : sets) names += (names.empty() ? "" : ", ") + s.name;
    EMOE_THROW(UsageError, "task {} has no out-of-domain set '{}' (sets: {})", task, set,
               names.empty() ? "none" : names);
  }
  const std::string path = data_root + "/" + it->file;
  Dataset d;
  d.task = spec;
  d.name = task + "-ood/" + set;
  d.source = path;
  switch (it->format) {
    case OodFormat::kGlueX:
      ood_load_table(*it, read_delimited(path, '\t', true, true), spec, d);
      break;
    case OodFormat::kTextFoolerNli:
    case OodFormat::kColaRaw:
      ood_load_table(*it, read_delimited(path, '\t', false, false), spec, d);
      break;
    case OodFormat::kSnliJsonl:
      ood_load_table(*it, read_jsonl(path), spec, d);
      break;
    case OodFormat::kTextFoolerSentiment:
      ood_load_textfooler_sentiment(path, spec, d);
      break;
    case OodFormat::kAdvGlue:
      ood_load_advglue(*it, path, spec, d);
      break;
  }
  // A 2-way NLI set scored with a 3-way (MNLI) model: see ood_label.
  if (it->labels == OodLabels::kNli2 && spec.num_labels() == 3) d.prediction_labels = {0, 1, 1};
  return d;
}

}  // namespace emoe

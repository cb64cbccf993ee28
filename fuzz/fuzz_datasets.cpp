// Fuzzes the dataset readers. The first byte picks the reader, the second its options, and the
// rest is the file:
//   0: load_table on a TSV, 1: on a CSV, 2: on a JSONL file (options: header, quoting, label
//      names or integer labels, one or two text columns by name or by index, regression)
//   3: load_glue: the file stands in for one split of a GLUE task (option picks which)
//   4: load_ood: the file stands in for one out-of-domain set (GLUE-X TSV, SNLI-hard JSONL,
//      TextFooler TSV and sentiment text, AdvGLUE JSON, CoLA's raw TSV)
//   5: load_alpaca (instruction JSON), 6: load_mmlu_csv (question, four options, answer)
// Our typed errors (InputError and its UsageError, RuntimeError) are the expected outcome of bad
// files; anything else escaping is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/data/dataset.h"
#include "fuzz_util.h"

namespace {

struct Place {
  const char* task;
  const char* split_or_set;
  const char* file;  // relative to the data root
};

const Place kGlue[] = {{"sst2", "dev", "glue/SST-2/dev.tsv"},
                       {"cola", "train", "glue/CoLA/train.tsv"},
                       {"cola", "test", "glue/CoLA/test.tsv"},
                       {"mnli", "dev", "glue/MNLI/dev_matched.tsv"},
                       {"mnli", "dev_textfooler", "glue/MNLI/textfooler_1k/mnli_matched.tsv"},
                       {"stsb", "dev", "glue/STS-B/dev.tsv"},
                       {"qqp", "train", "glue/QQP/train.tsv"},
                       {"mrpc", "test", "glue/MRPC/test.tsv"}};
const Place kOod[] = {
    {"sst2", "imdb", "ood/glue_x_human_annotated/tsv_DERIVED/SA_12.7__imdb.tsv"},
    {"sst2", "flipkart", "ood/glue_x_human_annotated/tsv_DERIVED/sampled_flipkart__Sheet1.tsv"},
    {"mnli", "hans", "ood/glue_x_human_annotated/tsv_DERIVED/textual_entailment__hans.tsv"},
    {"mnli", "snli-hard", "ood/nli/snli_1.0_test_hard.jsonl"},
    {"mnli", "textfooler-snli", "ood/nli/textfooler_snli_1k.tsv"},
    {"sst2", "textfooler-imdb", "ood/sentiment/textfooler/imdb_1k.txt"},
    {"sst2", "advglue", "ood/advglue/dev.json"},
    {"qqp", "advglue", "ood/advglue/dev.json"},
    {"cola", "out_of_domain_dev", "glue/CoLA/raw/out_of_domain_dev.tsv"},
    {"stsb", "sick", "ood/glue_x_human_annotated/tsv_DERIVED/stsb_ood__stsb.tsv"}};

void touch(const emoe::Dataset& d) {
  for (const auto& e : d.examples)
    for (const auto& t : e.texts) (void)t.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int kind = data[0] % 7;
  const uint8_t opt = data[1];
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  emoe_fuzz::clear();
  const std::string& root = emoe_fuzz::folder();
  try {
    if (kind <= 2) {
      static const char* const kFormats[] = {"tsv", "csv", "jsonl"};
      emoe::TableSpec spec;
      spec.format = kFormats[kind];
      spec.path = emoe_fuzz::put(std::string("t.") + spec.format, text);
      spec.header = (opt & 1) == 0;
      spec.quoted = (opt & 2) == 0;
      if (opt & 4)
        spec.text_cols = spec.header ? std::vector<std::string>{"sentence1", "sentence2"}
                                     : std::vector<std::string>{"0", "1"};
      else
        spec.text_cols = {spec.header ? "sentence" : "0"};
      spec.label_col = (opt & 8) ? "" : (spec.header ? "label" : "2");
      if (opt & 16) spec.label_map = {{"neg", 0}, {"pos", 1}};
      emoe::TaskSpec task;
      task.name = "fuzz";
      task.regression = (opt & 32) != 0;
      if (!task.regression) task.labels = {"neg", "pos"};
      task.metrics = {task.regression ? "pearson" : "accuracy"};
      task.main_metric = task.metrics[0];
      touch(emoe::load_table(spec, task));
    } else if (kind == 3) {
      const Place& p = kGlue[opt % (sizeof(kGlue) / sizeof(kGlue[0]))];
      emoe_fuzz::put(p.file, text);
      touch(emoe::load_glue(p.task, p.split_or_set, root));
    } else if (kind == 4) {
      const Place& p = kOod[opt % (sizeof(kOod) / sizeof(kOod[0]))];
      emoe_fuzz::put(p.file, text);
      touch(emoe::load_ood(p.task, p.split_or_set, root));
    } else if (kind == 5) {
      for (const auto& e : emoe::load_alpaca(emoe_fuzz::put("alpaca.json", text)))
        (void)emoe::alpaca_prompt(e);
    } else {
      auto qs = emoe::load_mmlu_csv(emoe_fuzz::put("x_val.csv", text), "fuzz");
      if (!qs.empty()) (void)emoe::mmlu_prompt(qs.back(), {qs.begin(), qs.end() - 1});
    }
  } catch (const emoe::InputError&) {
  } catch (const emoe::RuntimeError&) {
  }
  return 0;
}

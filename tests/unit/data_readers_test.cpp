// Data readers on small files written here: quoting, BOM, headers, JSONL, column errors, GLUE
// layouts, batching, epoch order, the Alpaca and MMLU prompts.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/data/batching.h"
#include "emoe/data/dataset.h"
#include "emoe/data/text_table.h"
#include "emoe/tokenizer/tokenizer.h"
#include "support/test_support.h"

namespace {

void readers_write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Runs `fn`, expects an error of type E whose message holds every needle.
template <typename E = emoe::InputError>
void readers_expect_error(const std::function<void()>& fn,
                          const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning " << needles.front();
  } catch (const E& e) {
    std::string what = e.what();
    for (const auto& n : needles)
      EXPECT_NE(what.find(n), std::string::npos) << "message: " << what << "\nmissing: " << n;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line expected: " << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
  }
}

emoe::TaskSpec readers_binary_task() {
  emoe::TaskSpec t;
  t.name = "toy";
  t.labels = {"neg", "pos"};
  t.metrics = {"accuracy"};
  t.main_metric = "accuracy";
  return t;
}

TEST(DataReaders, CsvQuotingEscapesAndMultiLineFields) {
  emoe::test::TempDir dir;
  // BOM, CRLF line ends, a quoted delimiter, "" escapes, a field spanning two lines, a blank line.
  readers_write(dir.file("t.csv"),
                "\xEF\xBB\xBFtext,label\r\n"
                "\"x, y\",1\r\n"
                "\"he said \"\"hi\"\"\",0\r\n"
                "\r\n"
                "\"two\nlines\",1\n"
                "plain \"inner\" quote,0");
  emoe::TableSpec spec;
  spec.path = dir.file("t.csv");
  spec.text_cols = {"text"};
  spec.label_col = "label";
  auto d = emoe::load_table(spec, readers_binary_task());
  ASSERT_EQ(d.examples.size(), 4u);
  EXPECT_EQ(d.examples[0].texts[0], "x, y");
  EXPECT_EQ(d.examples[1].texts[0], "he said \"hi\"");
  EXPECT_EQ(d.examples[2].texts[0], "two\nlines");
  EXPECT_EQ(d.examples[3].texts[0], "plain \"inner\" quote");
  EXPECT_EQ(d.examples[0].label, 1);
  EXPECT_EQ(d.examples[1].label, 0);
  EXPECT_EQ(d.source, spec.path);
  EXPECT_EQ(d.task.name, "toy");

  // Line numbers count the lines inside quoted fields: the row after "two\nlines" starts on 7.
  auto t = emoe::read_delimited(dir.file("t.csv"), ',', true, true);
  ASSERT_EQ(t.rows.size(), 4u);
  EXPECT_EQ(t.columns, (std::vector<std::string>{"text", "label"}));  // BOM gone
  EXPECT_EQ(t.rows[2].line, 5);
  EXPECT_EQ(t.rows[3].line, 7);
}

TEST(DataReaders, QuotedErrorsNameFileAndLine) {
  emoe::test::TempDir dir;
  readers_write(dir.file("open.csv"), "a,b\n1,2\n\"never closed,3\n");
  readers_expect_error([&] { emoe::read_delimited(dir.file("open.csv"), ',', true, true); },
                       {dir.file("open.csv") + ":3", "never closed"});
  readers_write(dir.file("after.csv"), "a,b\n\"x\"y,2\n");
  readers_expect_error([&] { emoe::read_delimited(dir.file("after.csv"), ',', true, true); },
                       {dir.file("after.csv") + ":2", "after a closing quote"});
  readers_write(dir.file("ragged.tsv"), "a\tb\n1\t2\n3\n");
  readers_expect_error([&] { emoe::read_delimited(dir.file("ragged.tsv"), '\t', false, true); },
                       {dir.file("ragged.tsv") + ":3", "1 fields, expected 2"});
}

TEST(DataReaders, TsvWithAndWithoutQuoteHandling) {
  emoe::test::TempDir dir;
  // A GLUE-style TSV: an unmatched quote must stay text when quoting is off.
  readers_write(dir.file("g.tsv"), "s1\ts2\tlabel\n\"quoted\ttab\"\tx\t1\n");
  auto q = emoe::read_delimited(dir.file("g.tsv"), '\t', true, true);
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0].fields[0], "quoted\ttab");
  EXPECT_EQ(q.rows[0].fields[1], "x");
  // Without quoting, the tab inside quotes splits the row into four fields.
  readers_expect_error([&] { emoe::read_delimited(dir.file("g.tsv"), '\t', false, true); },
                       {dir.file("g.tsv") + ":2", "4 fields, expected 3"});
  // A GLUE-style TSV (MRPC): a bare, unmatched quote is text when quoting is off; with quoting
  // on, the field runs into the next line.
  readers_write(dir.file("p.tsv"), "s1\ts2\tlabel\n\"open quote\ty\t0\n\"a \"\"b\"\"\"\tz\t1\n");
  auto p = emoe::read_delimited(dir.file("p.tsv"), '\t', false, true);
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_EQ(p.rows[0].fields[0], "\"open quote");
  EXPECT_EQ(p.rows[1].fields[0], "\"a \"\"b\"\"\"");
  readers_expect_error([&] { emoe::read_delimited(dir.file("p.tsv"), '\t', true, true); },
                       {dir.file("p.tsv") + ":3", "after a closing quote", "began on line 2"});

  emoe::TableSpec spec;
  spec.path = dir.file("p.tsv");
  spec.text_cols = {"s1", "s2"};
  spec.label_col = "label";
  spec.quoted = false;
  auto d = emoe::load_table(spec, readers_binary_task());
  ASSERT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(d.examples[0].texts, (std::vector<std::string>{"\"open quote", "y"}));
  EXPECT_EQ(d.examples[1].label, 1);
}

TEST(DataReaders, HeaderlessColumnsByIndexAndLabelMap) {
  emoe::test::TempDir dir;
  readers_write(dir.file("h.tsv"), "src\tgood\t\tfirst sentence\nsrc\tbad\t*\tsecond one\n");
  emoe::TableSpec spec;
  spec.path = dir.file("h.tsv");
  spec.header = false;
  spec.text_cols = {"3"};
  spec.label_col = "1";
  spec.label_map = {{"bad", 0}, {"good", 1}};
  auto d = emoe::load_table(spec, readers_binary_task());
  ASSERT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(d.examples[0].texts[0], "first sentence");
  EXPECT_EQ(d.examples[0].label, 1);
  EXPECT_EQ(d.examples[1].label, 0);

  spec.label_map = {{"good", 1}};
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {dir.file("h.tsv") + ":2", "'bad'", "'good'"});
  spec.label_map.clear();
  spec.text_cols = {"sentence"};
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {dir.file("h.tsv"), "'sentence'", "no header", "0..3"});
  spec.text_cols = {"7"};
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {dir.file("h.tsv"), "column index 7", "4 columns"});
}

TEST(DataReaders, MissingColumnNamesFileColumnAndColumnsPresent) {
  emoe::test::TempDir dir;
  readers_write(dir.file("m.csv"), "sentence,label\nhello,1\n");
  emoe::TableSpec spec;
  spec.path = dir.file("m.csv");
  spec.text_cols = {"text"};
  spec.label_col = "label";
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {dir.file("m.csv"), "column 'text' not found", "sentence, label"});
  spec.text_cols = {"sentence"};
  spec.label_col = "gold";
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {"'gold'", "sentence, label"});
  // Labels: names of the task, integer ids, and ids out of range.
  readers_write(dir.file("n.csv"), "sentence,label\na,pos\nb,0\n");
  spec.path = dir.file("n.csv");
  spec.label_col = "label";
  auto d = emoe::load_table(spec, readers_binary_task());
  EXPECT_EQ(d.examples[0].label, 1);
  EXPECT_EQ(d.examples[1].label, 0);
  readers_write(dir.file("r.csv"), "sentence,label\na,2\n");
  spec.path = dir.file("r.csv");
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {dir.file("r.csv") + ":2", "class id 2", "0..1"});
  // Unlabelled.
  spec.label_col = "";
  auto u = emoe::load_table(spec, readers_binary_task());
  ASSERT_EQ(u.examples.size(), 1u);
  EXPECT_FALSE(u.examples[0].has_label);
  // Format: by extension, or given.
  spec.path = dir.file("r.txt");
  readers_write(spec.path, "x");
  readers_expect_error<emoe::UsageError>([&] { emoe::load_table(spec, readers_binary_task()); },
                                         {"r.txt", "'.txt'", ".tsv, .csv or .jsonl"});
  spec.path = dir.file("absent.csv");
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {dir.file("absent.csv") + ": not found"});
}

TEST(DataReaders, JsonlByKeysWithRegressionLabels) {
  emoe::test::TempDir dir;
  readers_write(dir.file("s.jsonl"),
                "{\"a\": \"first\", \"b\": \"second\", \"score\": 4.5}\n"
                "\n"
                "{\"b\": \"y\", \"a\": \"x\", \"score\": 2, \"extra\": [1, 2]}\n");
  emoe::TaskSpec reg;
  reg.name = "sim";
  reg.regression = true;
  emoe::TableSpec spec;
  spec.path = dir.file("s.jsonl");
  spec.text_cols = {"a", "b"};
  spec.label_col = "score";
  auto d = emoe::load_table(spec, reg);
  ASSERT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(d.examples[1].texts, (std::vector<std::string>{"x", "y"}));
  EXPECT_DOUBLE_EQ(d.examples[0].label, 4.5);
  EXPECT_DOUBLE_EQ(d.examples[1].label, 2.0);
  // By index: keys in order of first appearance (a, b, score, extra).
  spec.text_cols = {"1"};
  spec.label_col = "2";
  EXPECT_EQ(emoe::load_table(spec, reg).examples[0].texts[0], "second");

  readers_write(dir.file("k.jsonl"), "{\"a\": \"x\", \"score\": 1}\n{\"score\": 2}\n");
  spec.path = dir.file("k.jsonl");
  spec.text_cols = {"a"};
  spec.label_col = "score";
  readers_expect_error([&] { emoe::load_table(spec, reg); },
                       {dir.file("k.jsonl") + ":2", "key 'a' missing", "score"});
  readers_write(dir.file("bad.jsonl"), "{\"a\": 1}\n[1, 2]\n");
  spec.path = dir.file("bad.jsonl");
  readers_expect_error([&] { emoe::load_table(spec, reg); },
                       {dir.file("bad.jsonl") + ":2", "object"});
  readers_write(dir.file("nan.jsonl"), "{\"a\": \"x\", \"score\": \"high\"}\n");
  spec.path = dir.file("nan.jsonl");
  readers_expect_error([&] { emoe::load_table(spec, reg); },
                       {dir.file("nan.jsonl") + ":1", "'high'", "number"});
}

TEST(DataReaders, GlueRegistry) {
  auto names = emoe::glue_task_names();
  EXPECT_EQ(names.size(), 10u);
  auto rte = emoe::glue_task("rte");
  EXPECT_EQ(rte.labels, (std::vector<std::string>{"entailment", "not_entailment"}));
  auto mnli = emoe::glue_task("mnli");
  EXPECT_EQ(mnli.labels, (std::vector<std::string>{"entailment", "neutral", "contradiction"}));
  EXPECT_EQ(emoe::glue_task("wnli").labels[1], "entailment");
  auto stsb = emoe::glue_task("stsb");
  EXPECT_TRUE(stsb.regression);
  EXPECT_EQ(stsb.num_labels(), 1);
  EXPECT_EQ(stsb.main_metric, "mean");  // of pearson and spearman
  EXPECT_EQ(emoe::glue_task("cola").metrics, (std::vector<std::string>{"mcc"}));
  EXPECT_EQ(emoe::glue_task("mrpc").metrics, (std::vector<std::string>{"accuracy", "f1"}));
  EXPECT_EQ(emoe::glue_task("qqp").main_metric, "mean");  // of accuracy and f1
  readers_expect_error<emoe::UsageError>([] { emoe::glue_task("squad"); },
                                         {"'squad'", "cola", "wnli"});
  readers_expect_error<emoe::UsageError>([] { emoe::ood_set_names("squad"); }, {"'squad'"});
  EXPECT_TRUE(emoe::ood_set_names("wnli").empty());
  readers_expect_error<emoe::UsageError>([] { emoe::load_ood("sst2", "reddit", "/nowhere"); },
                                         {"'reddit'", "imdb", "advglue"});
}

TEST(DataReaders, GlueOfficialLayouts) {
  emoe::test::TempDir root;
  std::filesystem::create_directories(root.file("glue/MNLI"));
  std::filesystem::create_directories(root.file("glue/QQP"));
  std::filesystem::create_directories(root.file("glue/WNLI"));
  // MNLI dev_matched: 16 columns, bare quotes in the text, label words in gold_label.
  const std::string mnli_header =
      "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
      "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\t"
      "label5\tgold_label\n";
  readers_write(
      root.file("glue/MNLI/dev_matched.tsv"),
      mnli_header +
          "0\t1\t1n\tfiction\t(x)\t(y)\t(X)\t(Y)\tHe said \"no.\tHe spoke.\tneutral\tneutral\t"
          "neutral\tneutral\tneutral\tneutral\n"
          "1\t2\t2c\tfiction\t(x)\t(y)\t(X)\t(Y)\tA b.\tC d.\tcontradiction\tcontradiction\t"
          "neutral\tcontradiction\tcontradiction\tcontradiction\n");
  auto mnli = emoe::load_glue("mnli", "dev", root.path());
  ASSERT_EQ(mnli.examples.size(), 2u);
  EXPECT_EQ(mnli.examples[0].texts, (std::vector<std::string>{"He said \"no.", "He spoke."}));
  EXPECT_EQ(mnli.examples[0].label, 1);
  EXPECT_EQ(mnli.examples[1].label, 2);
  EXPECT_EQ(mnli.name, "mnli/dev");
  readers_expect_error(
      [&] { emoe::load_glue("mnli-mm", "dev", root.path()); },
      {root.file("glue/MNLI/dev_mismatched.tsv") + ": not found (GLUE task mnli-mm, "
                                                   "split dev)"});
  // QQP train and unlabelled test.
  readers_write(root.file("glue/QQP/train.tsv"),
                "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n7\t1\t2\tWhy?\tHow?\t1\n");
  readers_write(root.file("glue/QQP/test.tsv"), "id\tquestion1\tquestion2\n0\tA?\tB?\n");
  auto qqp = emoe::load_glue("qqp", "train", root.path());
  ASSERT_EQ(qqp.examples.size(), 1u);
  EXPECT_EQ(qqp.examples[0].texts[1], "How?");
  EXPECT_EQ(qqp.examples[0].label, 1);
  auto qqp_test = emoe::load_glue("qqp", "test", root.path());
  EXPECT_FALSE(qqp_test.examples[0].has_label);
  readers_expect_error([&] { emoe::load_glue("qqp", "dev", root.path()); },
                       {root.file("glue/QQP/dev.tsv") + ": not found (GLUE task qqp, split dev)"});
  // WNLI: integer labels, 1 = entailment.
  readers_write(root.file("glue/WNLI/train.tsv"),
                "index\tsentence1\tsentence2\tlabel\n0\ta\tb\t1\n");
  EXPECT_EQ(emoe::load_glue("wnli", "train", root.path()).examples[0].label, 1);
  // A labelled split without its label column is an error; so is an unknown split.
  readers_write(root.file("glue/WNLI/dev.tsv"), "index\tsentence1\tsentence2\n0\ta\tb\n");
  readers_expect_error([&] { emoe::load_glue("wnli", "dev", root.path()); },
                       {root.file("glue/WNLI/dev.tsv"), "'label'"});
  readers_expect_error<emoe::UsageError>(
      [&] { emoe::load_glue("wnli", "validation", root.path()); },
      {"'validation'", "train, dev, test"});
  readers_expect_error(
      [&] { emoe::load_glue("cola", "train", root.path()); },
      {root.file("glue/CoLA/train.tsv") + ": not found (GLUE task cola, split train",
       "raw/in_domain_train.tsv"});
}

// epoch_order(10, seed 1234, epoch 0), computed by an independent Python version of the same
// steps (SplitMix64 mix of (seed, epoch), std::mt19937_64, rejection-sampled Fisher-Yates).
const std::vector<int64_t> kReadersPinnedOrder = {2, 0, 3, 5, 9, 1, 7, 6, 4, 8};
const std::vector<int64_t> kReadersPinnedOrderEpoch1 = {9, 4, 7, 5, 1, 6, 2, 8, 3, 0};

TEST(DataReaders, EpochOrderIsADeterministicPermutation) {
  auto a = emoe::epoch_order(100, 42, 3);
  EXPECT_EQ(a, emoe::epoch_order(100, 42, 3));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(100);
  for (int64_t i = 0; i < 100; ++i) identity[i] = i;
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(a, identity);
  EXPECT_NE(a, emoe::epoch_order(100, 42, 4));
  EXPECT_NE(a, emoe::epoch_order(100, 43, 3));
  EXPECT_EQ(emoe::epoch_order(100, 42, 3, false), identity);
  EXPECT_TRUE(emoe::epoch_order(0, 1, 0).empty());
  EXPECT_EQ(emoe::epoch_order(1, 1, 0), std::vector<int64_t>{0});
  // The order is part of a run's reproducibility (resume): pinned for one (seed, epoch).
  EXPECT_EQ(emoe::epoch_order(10, 1234, 0), kReadersPinnedOrder);
  EXPECT_EQ(emoe::epoch_order(10, 1234, 1), kReadersPinnedOrderEpoch1);
}

TEST(DataReaders, CollatePadsClassificationRegressionAndLm) {
  emoe::EncodedExample a, b;
  a.ids = {101, 7, 8, 102};
  a.type_ids = {0, 0, 1, 1};
  a.label = 1;
  a.lm_labels = {-100, -100, 8, 102};
  b.ids = {101, 9};
  b.label = 0;  // no type ids: zeros
  b.lm_labels = {-100, 9};
  auto cls = emoe::collate({&a, &b}, 0, false, false);
  EXPECT_EQ(cls.input_ids.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(torch::equal(
      cls.input_ids, torch::tensor({101, 7, 8, 102, 101, 9, 0, 0}, torch::kLong).view({2, 4})));
  EXPECT_TRUE(torch::equal(cls.attention_mask,
                           torch::tensor({1, 1, 1, 1, 1, 1, 0, 0}, torch::kLong).view({2, 4})));
  EXPECT_TRUE(torch::equal(cls.token_type_ids,
                           torch::tensor({0, 0, 1, 1, 0, 0, 0, 0}, torch::kLong).view({2, 4})));
  EXPECT_EQ(cls.labels.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(cls.labels, torch::tensor({1, 0}, torch::kLong)));

  a.label = 3.75;
  auto reg = emoe::collate({&b, &a}, 5, true, false);
  EXPECT_EQ(reg.labels.scalar_type(), torch::kFloat);
  EXPECT_FLOAT_EQ(reg.labels[1].item<float>(), 3.75f);
  EXPECT_EQ(reg.input_ids[0][3].item<int64_t>(), 5);  // pad id

  auto lm = emoe::collate({&a, &b}, 0, false, true);
  EXPECT_EQ(lm.labels.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(torch::equal(
      lm.labels,
      torch::tensor({-100, -100, 8, 102, -100, 9, -100, -100}, torch::kLong).view({2, 4})));
  b.lm_labels.clear();
  readers_expect_error<emoe::UsageError>(
      [&] {
        emoe::collate({&a, &b}, 0, false, true);
      },
      {"example 1", "LM labels"});
  readers_expect_error<emoe::UsageError>([&] { emoe::collate({}, 0, false, false); },
                                         {"no examples"});
}

// A WordPiece vocabulary small enough to write here.
void readers_write_toy_vocab(const emoe::test::TempDir& dir) {
  readers_write(dir.file("vocab.txt"),
                "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\nsat\non\nmat\na\ndog\n.\n##s\n");
}

TEST(DataReaders, EncodeDatasetSinglesPairsAndTruncation) {
  emoe::test::TempDir dir;
  readers_write_toy_vocab(dir);
  auto tok = emoe::load_tokenizer(dir.path());
  emoe::Dataset d;
  d.task = readers_binary_task();
  d.name = "toy/dev";
  d.examples.push_back({{"the cat sat"}, 1, true});
  d.examples.push_back({{"the cat", "a dog sat on the mat ."}, 0, true});
  auto enc = emoe::encode_dataset(d, *tok, 8);
  ASSERT_EQ(enc.size(), 2u);
  EXPECT_EQ(enc[0].ids, (std::vector<int64_t>{2, 5, 6, 7, 3}));
  EXPECT_EQ(enc[0].type_ids, (std::vector<int64_t>(5, 0)));
  EXPECT_EQ(enc[0].label, 1);
  ASSERT_EQ(enc[1].ids.size(), 8u);  // longest_first truncation keeps room for 3 specials
  EXPECT_EQ(enc[1].ids.front(), 2);
  EXPECT_EQ(enc[1].ids.back(), 3);
  EXPECT_EQ(enc[1].type_ids.back(), 1);
  EXPECT_EQ(enc[1].type_ids.front(), 0);
  d.examples.push_back({{"a", "b", "c"}, 0, true});
  readers_expect_error<emoe::UsageError>([&] { emoe::encode_dataset(d, *tok, 8); },
                                         {"toy/dev", "example 2", "3 texts"});
}

TEST(DataReaders, AlpacaTemplatesAndLoss) {
  emoe::InstructionExample with{"Add the numbers.", "2 and 3", "5"};
  EXPECT_EQ(emoe::alpaca_prompt(with),
            "Below is an instruction that describes a task, paired with an input that provides "
            "further context. Write a response that appropriately completes the request.\n\n"
            "### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n");
  emoe::InstructionExample without{"Name a colour.", "", "Red"};
  EXPECT_EQ(emoe::alpaca_prompt(without),
            "Below is an instruction that describes a task. Write a response that appropriately "
            "completes the request.\n\n### Instruction:\nName a colour.\n\n### Response:\n");

  emoe::test::TempDir dir;
  readers_write(dir.file("a.json"),
                R"([{"instruction": "Name a colour.", "input": "", "output": "Red"},
            {"instruction": "Say hi.", "output": "the cat"}])");
  auto data = emoe::load_alpaca(dir.file("a.json"));
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[1].input, "");
  EXPECT_EQ(data[1].output, "the cat");
  readers_write(dir.file("b.json"), R"([{"instruction": "x", "input": ""}])");
  readers_expect_error([&] { emoe::load_alpaca(dir.file("b.json")); },
                       {dir.file("b.json"), "item 0", "'output'"});
  readers_write(dir.file("c.json"), R"({"instruction": "x"})");
  readers_expect_error([&] { emoe::load_alpaca(dir.file("c.json")); },
                       {dir.file("c.json"), "array"});

  // Loss only on the response: -100 over [CLS] prompt [SEP], the ids of "the cat" after it.
  readers_write_toy_vocab(dir);
  auto tok = emoe::load_tokenizer(dir.path());
  auto enc = emoe::encode_instructions(data, *tok, 0);
  const auto prompt = tok->encode(emoe::alpaca_prompt(data[1]), true).ids;
  ASSERT_EQ(enc[1].ids.size(), prompt.size() + 2);
  EXPECT_EQ(enc[1].ids.back(), 6);
  EXPECT_EQ(enc[1].lm_labels, [&] {
    std::vector<int64_t> l(prompt.size(), -100);
    l.push_back(5);
    l.push_back(6);
    return l;
  }());
  auto cut = emoe::encode_instructions(data, *tok, static_cast<int64_t>(prompt.size()) + 1);
  EXPECT_EQ(cut[1].ids.size(), prompt.size() + 1);
  EXPECT_EQ(cut[1].lm_labels.back(), 5);
  EXPECT_EQ(cut[1].type_ids.size(), cut[1].ids.size());
}

TEST(DataReaders, MmluCsvAndPrompt) {
  emoe::test::TempDir dir;
  std::filesystem::create_directories(dir.file("val"));
  readers_write(
      dir.file("val/high_school_physics_val.csv"),
      "What is 1+1?,1,2,3,4,B\n"
      "\"Statement 1 | x, y.\nStatement 2 | z.\",\"True, True\",\"False, False\",a,b,D\n");
  readers_write(dir.file("val/anatomy_val.csv"), "Bones?,206,2,3,4,A\n");
  auto split = emoe::load_mmlu_split(dir.file("val"));
  ASSERT_EQ(split.size(), 3u);
  EXPECT_EQ(split[0].subject, "anatomy");  // sorted by subject
  EXPECT_EQ(split[1].subject, "high_school_physics");
  EXPECT_EQ(split[1].answer, 1);
  EXPECT_EQ(split[2].question, "Statement 1 | x, y.\nStatement 2 | z.");
  EXPECT_EQ(split[2].choices, (std::vector<std::string>{"True, True", "False, False", "a", "b"}));
  EXPECT_EQ(split[2].answer, 3);

  EXPECT_EQ(emoe::mmlu_prompt(split[2], {split[1]}),
            "The following are multiple choice questions (with answers) about high school "
            "physics.\n\n"
            "What is 1+1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n"
            "Statement 1 | x, y.\nStatement 2 | z.\nA. True, True\nB. False, False\nC. a\nD. "
            "b\nAnswer:");
  EXPECT_EQ(emoe::mmlu_prompt(split[0], {}),
            "The following are multiple choice questions (with answers) about anatomy.\n\n"
            "Bones?\nA. 206\nB. 2\nC. 3\nD. 4\nAnswer:");

  readers_write(dir.file("bad_val.csv"), "Q,1,2,3,4,E\n");
  readers_expect_error([&] { emoe::load_mmlu_csv(dir.file("bad_val.csv"), ""); },
                       {dir.file("bad_val.csv") + ":1", "'E'", "A, B, C or D"});
  readers_write(dir.file("short_val.csv"), "Q,1,2,3,B\n");
  readers_expect_error([&] { emoe::load_mmlu_csv(dir.file("short_val.csv"), ""); },
                       {dir.file("short_val.csv"), "5 columns, expected 6"});
  EXPECT_EQ(emoe::load_mmlu_csv(dir.file("val/anatomy_val.csv"), "").front().subject, "anatomy");
}

}  // namespace

// Hostile tables (issue 25): null is reported as null, a number is no text, a label list with a
// name twice is refused, and a file without rows says so with its name.
TEST(DataReaders, HostileTablesNullNumberDuplicateLabelsAndNoRows) {
  emoe::test::TempDir dir;
  emoe::TableSpec spec;
  spec.text_cols = {"sentence"};
  spec.label_col = "label";
  spec.path = dir.file("null.jsonl");
  readers_write(spec.path,
                "{\"sentence\": \"fine\", \"label\": 1}\n{\"sentence\": null, \"label\": 0}\n");
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {spec.path + ":2", "key 'sentence': the value is null"});
  spec.path = dir.file("number.jsonl");
  readers_write(spec.path, "{\"sentence\": 5, \"label\": 1}\n");
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {spec.path + ":1", "key 'sentence': expected text (a JSON string), got 5"});
  spec.path = dir.file("nulllabel.jsonl");
  readers_write(spec.path, "{\"sentence\": \"x\", \"label\": null}\n");
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {spec.path + ":1", "key 'label': the value is null"});
  // a number stays a valid label
  spec.path = dir.file("ok.jsonl");
  readers_write(spec.path, "{\"sentence\": \"x\", \"label\": 1}\n");
  EXPECT_EQ(emoe::load_table(spec, readers_binary_task()).examples.at(0).label, 1);

  auto twice = readers_binary_task();
  twice.labels = {"pos", "pos"};
  readers_expect_error([&] { emoe::load_table(spec, twice); },
                       {"task toy: labels: 'pos' is listed twice (pos, pos)"});

  spec.path = dir.file("header.tsv");
  readers_write(spec.path, "sentence\tlabel\n");
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {spec.path + ": no examples (a header and no rows)"});
  spec.path = dir.file("empty.jsonl");
  readers_write(spec.path, "\n");
  readers_expect_error([&] { emoe::load_table(spec, readers_binary_task()); },
                       {spec.path + ": no examples (the file is empty)"});
}

TEST(DataReaders, AlpacaWithoutAnyOutputHasNoTrainingExamples) {
  emoe::test::TempDir dir;
  const std::string path = dir.file("a.json");
  readers_write(
      path, R"([{"instruction": "say hi", "output": ""}, {"instruction": "x", "output": " "}])");
  readers_expect_error([&] { emoe::load_alpaca(path); },
                       {path + ": no training examples (every item's 'output' is empty)"});
  readers_write(path, "[]");
  readers_expect_error([&] { emoe::load_alpaca(path); },
                       {path + ": no training examples (an empty array)"});
  readers_write(
      path, R"([{"instruction": "say hi", "output": ""}, {"instruction": "x", "output": "y"}])");
  EXPECT_EQ(emoe::load_alpaca(path).size(), 2u);
}

// MMLU: the headerless question CSVs of each subject and the few-shot prompt of Hendrycks et al.
#include <algorithm>
#include <cctype>
#include <filesystem>

#include "emoe/core/error.h"
#include "emoe/data/dataset.h"
#include "emoe/data/text_table.h"

namespace emoe {

namespace {

const char* const kMmluLetters[] = {"A", "B", "C", "D"};

// "<subject>_<split>.csv" -> "<subject>" (subjects keep their underscores).
std::string mmlu_subject_from_file(const std::string& path) {
  std::string stem = std::filesystem::path(path).stem().string();
  for (const char* split : {"_dev", "_val", "_test"}) {
    const std::string s = split;
    if (stem.size() > s.size() && stem.compare(stem.size() - s.size(), s.size(), s) == 0)
      return stem.substr(0, stem.size() - s.size());
  }
  return stem;
}

std::string mmlu_subject_words(std::string subject) {
  std::replace(subject.begin(), subject.end(), '_', ' ');
  return subject;
}

// "{q}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer:" as format_example in hendrycks/test.
std::string mmlu_question(const MultipleChoiceExample& q) {
  std::string s = q.question;
  for (size_t j = 0; j < q.choices.size(); ++j)
    s += "\n" + std::string(kMmluLetters[j]) + ". " + q.choices[j];
  return s + "\nAnswer:";
}

}  // namespace

std::vector<MultipleChoiceExample> load_mmlu_csv(const std::string& path,
                                                 const std::string& subject) {
  TextTable table = read_delimited(path, ',', true, false);
  EMOE_CHECK(table.rows.empty() || table.columns.size() == 6, InputError,
             "{}: {} columns, expected 6 (question, A, B, C, D, answer)", path,
             table.columns.size());
  const std::string name = subject.empty() ? mmlu_subject_from_file(path) : subject;
  std::vector<MultipleChoiceExample> out;
  out.reserve(table.rows.size());
  for (const auto& row : table.rows) {
    MultipleChoiceExample e;
    e.subject = name;
    e.question = row.fields[0];
    e.choices.assign(row.fields.begin() + 1, row.fields.begin() + 5);
    std::string letter = row.fields[5];
    letter.erase(std::remove_if(letter.begin(), letter.end(),
                                [](unsigned char c) { return std::isspace(c) != 0; }),
                 letter.end());
    auto it = std::find(std::begin(kMmluLetters), std::end(kMmluLetters), letter);
    EMOE_CHECK(it != std::end(kMmluLetters), InputError,
               "{}:{}: answer '{}': expected A, B, C or D", path, row.line, row.fields[5]);
    e.answer = it - std::begin(kMmluLetters);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<MultipleChoiceExample> load_mmlu_split(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  EMOE_CHECK(fs::is_directory(dir, ec), InputError, "{}: not found or not a directory", dir);
  std::vector<std::pair<std::string, std::string>> files;  // (subject, path)
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".csv") continue;
    files.emplace_back(mmlu_subject_from_file(entry.path().string()), entry.path().string());
  }
  EMOE_CHECK(!files.empty(), InputError, "{}: no .csv files (expected <subject>_<split>.csv)", dir);
  std::sort(files.begin(), files.end());
  std::vector<MultipleChoiceExample> out;
  for (const auto& [subject, path] : files) {
    auto part = load_mmlu_csv(path, subject);
    out.insert(out.end(), std::make_move_iterator(part.begin()),
               std::make_move_iterator(part.end()));
  }
  return out;
}

// Hendrycks et al.'s gen_prompt writes the subject as " " + words, which leaves two spaces after
// "about"; the single space here is the form most evaluations (lm-evaluation-harness) use.
std::string mmlu_prompt(const MultipleChoiceExample& q,
                        const std::vector<MultipleChoiceExample>& shots) {
  EMOE_CHECK(q.choices.size() == 4, UsageError, "MMLU question: {} choices, expected 4",
             q.choices.size());
  std::string s = "The following are multiple choice questions (with answers) about " +
                  mmlu_subject_words(q.subject) + ".\n\n";
  for (const auto& shot : shots) {
    EMOE_CHECK(shot.choices.size() == 4 && shot.answer >= 0 && shot.answer < 4, UsageError,
               "MMLU shot: expected 4 choices and an answer 0..3, got {} and {}",
               shot.choices.size(), shot.answer);
    s += mmlu_question(shot) + " " + kMmluLetters[shot.answer] + "\n\n";
  }
  return s + mmlu_question(q);
}

}  // namespace emoe

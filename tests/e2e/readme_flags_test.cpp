// The README's command table against `emoe --help` and every subcommand's --help (issue 29): each
// command is a row, each flag a command lists is written in its row, and each flag a row writes
// exists, so the two cannot drift apart.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "support/test_support.h"

using emoe::test::run_emoe;

namespace {

// The README's command table: command name -> its row (every column).
std::map<std::string, std::string> readme_command_rows() {
  std::ifstream in(emoe::test::source_dir() + "/README.md");
  std::map<std::string, std::string> rows;
  const std::regex row(R"(^\| `emoe ([a-z]+)[ `])");
  std::smatch m;
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, m, row)) rows[m[1]] += line + "\n";
  return rows;
}

// The flags written in a piece of README text: --long-name and -x, not parts of words
// (top-k, GPT-2, emoe-learn).
std::set<std::string> flags_in_text(const std::string& text) {
  std::set<std::string> out;
  const std::regex flag(R"((^|[^A-Za-z0-9_-])(--[a-z][a-z0-9-]*|-[A-Za-z])(?![A-Za-z0-9_-]))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), flag); it != std::sregex_iterator();
       ++it)
    out.insert((*it)[2]);
  return out;
}

// The options of a CLI11 --help text: one entry per option, holding all its names ("-o",
// "--output"); --help itself left out.
std::vector<std::set<std::string>> help_options(const std::string& help) {
  std::vector<std::set<std::string>> out;
  std::stringstream ss(help);
  const std::regex names(
      R"(^  (-[A-Za-z0-9]|--[A-Za-z0-9][A-Za-z0-9-]*)((,(-[A-Za-z0-9]|--[A-Za-z0-9][A-Za-z0-9-]*))*))");
  std::smatch m;
  for (std::string line; std::getline(ss, line);) {
    if (!std::regex_search(line, m, names)) continue;
    std::set<std::string> option = {m[1]};
    std::stringstream rest(m[2].str());
    for (std::string name; std::getline(rest, name, ',');)
      if (!name.empty()) option.insert(name);
    if (!option.count("--help")) out.push_back(option);
  }
  return out;
}

// The subcommands `emoe --help` lists.
std::set<std::string> help_subcommands(const std::string& help) {
  std::set<std::string> out;
  std::stringstream ss(help);
  bool in_section = false;
  const std::regex sub(R"(^  ([a-z]+)\s)");
  std::smatch m;
  for (std::string line; std::getline(ss, line);) {
    if (line.rfind("Subcommands:", 0) == 0) {
      in_section = true;
      continue;
    }
    if (in_section && std::regex_search(line, m, sub)) out.insert(m[1]);
  }
  return out;
}

}  // namespace

TEST(ReadmeFlags, EveryCommandIsARowOfTheReadmeCommandTable) {
  const auto rows = readme_command_rows();
  auto r = run_emoe("--help");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto commands = help_subcommands(r.out);
  ASSERT_GE(commands.size(), 10u) << r.out;
  for (const auto& c : commands) EXPECT_TRUE(rows.count(c)) << "emoe " << c << ": no README row";
  for (const auto& [c, row] : rows) EXPECT_TRUE(commands.count(c)) << "README row of " << c;
}

TEST(ReadmeFlags, EveryHelpFlagIsInItsReadmeRowAndEveryRowFlagExists) {
  for (const auto& [command, row] : readme_command_rows()) {
    SCOPED_TRACE("emoe " + command);
    auto r = run_emoe(command + " --help");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto options = help_options(r.out);
    ASSERT_FALSE(options.empty()) << r.out;
    const auto written = flags_in_text(row);
    std::set<std::string> known;
    for (const auto& option : options) {
      known.insert(option.begin(), option.end());
      bool documented = false;
      for (const auto& name : option) documented = documented || written.count(name) > 0;
      EXPECT_TRUE(documented) << *option.rbegin() << " is in --help but not in the README's row";
    }
    for (const auto& flag : written)
      EXPECT_TRUE(known.count(flag)) << flag << " is in the README's row but not in --help";
  }
}

// The helpers themselves: flags inside words are not flags; CLI11's option lines are read whole.
TEST(ReadmeFlags, FlagsAreReadFromTextAndHelp) {
  EXPECT_EQ(flags_in_text("`emoe x [-o DIR] [--top-k K]` top-k GPT-2 emoe-learn --ood"),
            (std::set<std::string>{"-o", "--top-k", "--ood"}));
  const auto options = help_options(
      "Options:\n  -h,--help    Print\n  -o,--output TEXT REQUIRED\n  --threads INT\n"
      "                              -x in a description\n");
  ASSERT_EQ(options.size(), 2u);
  EXPECT_EQ(options[0], (std::set<std::string>{"-o", "--output"}));
  EXPECT_EQ(options[1], (std::set<std::string>{"--threads"}));
}

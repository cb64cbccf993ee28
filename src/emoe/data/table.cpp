// load_table: a user's TSV/CSV/JSONL file turned into a Dataset through its column mapping.
#include <filesystem>
#include <set>

#include "emoe/core/error.h"
#include "emoe/data/dataset.h"
#include "emoe/data/text_table.h"

namespace emoe {

Dataset load_table(const TableSpec& spec, const TaskSpec& task) {
  EMOE_CHECK(spec.text_cols.size() == 1 || spec.text_cols.size() == 2, UsageError,
             "{}: text columns: expected one or two (a sentence or a pair), got {}", spec.path,
             spec.text_cols.size());
  EMOE_CHECK(task.regression || !task.labels.empty(), UsageError,
             "task {}: a classification task needs its label names", task.name);
  // a name given twice would leave its second class id without examples
  std::set<std::string> names;
  for (const auto& l : task.labels)
    EMOE_CHECK(names.insert(l).second, InputError, "task {}: labels: '{}' is listed twice ({})",
               task.name, l, fmt::join(task.labels, ", "));
  const std::string format = table_format(spec.path, spec.format);
  TextTable table = format == "jsonl" ? read_jsonl(spec.path)
                    : format == "csv" ? read_delimited(spec.path, ',', true, spec.header)
                                      : read_delimited(spec.path, '\t', spec.quoted, spec.header);
  EMOE_CHECK(!table.rows.empty(), InputError, "{}: no examples ({})", spec.path,
             table.columns.empty() ? "the file is empty" : "a header and no rows");
  std::vector<size_t> text_idx;
  for (const auto& c : spec.text_cols) text_idx.push_back(resolve_column(table, c));
  const bool labelled = !spec.label_col.empty();
  const size_t label_idx = labelled ? resolve_column(table, spec.label_col) : 0;

  Dataset d;
  d.task = task;
  d.name = task.name + "/" + std::filesystem::path(spec.path).stem().string();
  d.source = spec.path;
  d.examples.reserve(table.rows.size());
  for (const auto& row : table.rows) {
    Example e;
    for (size_t c : text_idx) e.texts.push_back(table_text(table, row, c));
    e.has_label = labelled;
    if (labelled)
      e.label = parse_label(table_field(table, row, label_idx), task, spec.label_map, spec.path,
                            row.line);
    d.examples.push_back(std::move(e));
  }
  return d;
}

}  // namespace emoe

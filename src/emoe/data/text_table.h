// Raw tables from text files: TSV/CSV (with or without quoting) and JSONL, before any task meaning.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "emoe/data/dataset.h"

namespace emoe {

// What a cell held: text (every TSV/CSV cell, a JSON string), nothing (a JSONL row without the
// key), JSON null, or another JSON value (a number, a boolean, an array, an object), which the
// cell holds written as JSON.
enum class CellKind : uint8_t { kText, kMissing, kNull, kJson };

struct TextRow {
  int64_t line = 0;                 // 1-based line where the row starts (for messages)
  std::vector<std::string> fields;  // one per column of the table
  std::vector<CellKind> kinds;      // one per column: kText throughout a TSV/CSV
};

struct TextTable {
  std::string path;
  bool has_header = false;
  std::vector<std::string> columns;  // header names ("" for each column when there is no header)
  std::vector<TextRow> rows;
};

// The whole file as bytes, without a leading UTF-8 BOM. InputError "<path>: not found" otherwise.
std::string read_text_file(const std::string& path);

// The lines of a text file without their line ends ("\n" or "\r\n"); a final line end does not
// start another line.
std::vector<std::string> read_lines(const std::string& path);

// Delimited text. `quoted`: RFC 4180 quoting ("" escapes, delimiters and newlines inside quotes);
// otherwise every byte up to the delimiter or end of line is data (GLUE's own TSVs). CRLF and a
// BOM are accepted, blank lines skipped. Every row must have as many fields as the header (or the
// first row without a header): InputError naming file, line and both counts.
TextTable read_delimited(const std::string& path, char delimiter, bool quoted, bool header);
// The same on text already in memory (`path` only names it in messages).
TextTable parse_delimited(const std::string& text, const std::string& path, char delimiter,
                          bool quoted, bool header);

// One JSON object per line; columns are the keys in order of first appearance. Strings are kept,
// other values are written as JSON (1, 4.5, true) and their kind noted.
TextTable read_jsonl(const std::string& path);

// "tsv", "csv" or "jsonl" from TableSpec::format, or from the extension when it is empty.
std::string table_format(const std::string& path, const std::string& format);

// A column by header name or 0-based index (as text). InputError naming the file, the column and
// the columns present when there is no such column.
size_t resolve_column(const TextTable& table, const std::string& column);

// The value of `column` in `row` (a label: text or a JSON number); InputError naming file, line
// and key when a JSONL row lacks it or holds null there.
const std::string& table_field(const TextTable& table, const TextRow& row, size_t column);
// The same for a text column: a JSON number, boolean, array or object is refused as well.
const std::string& table_text(const TextTable& table, const TextRow& row, size_t column);

// A label cell turned into the task's id (or value for regression): through `label_map` when it
// is given; otherwise an integer id, or one of the task's label names. InputError naming the
// file, line and the accepted values otherwise.
double parse_label(const std::string& text, const TaskSpec& task,
                   const std::map<std::string, int64_t>& label_map, const std::string& path,
                   int64_t line);

}  // namespace emoe

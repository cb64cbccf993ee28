// Readers for delimited text (RFC 4180 CSV, quoted or plain TSV) and JSONL, and label parsing.
#include "emoe/data/text_table.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "emoe/core/error.h"
#include "emoe/core/json_depth.h"

namespace emoe {

namespace {

constexpr const char* kTableBom = "\xEF\xBB\xBF";

std::string table_join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string table_trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Printable form of a delimiter for messages.
std::string table_delimiter_name(char d) {
  return d == '\t' ? "tab" : std::string(1, d);
}

// Checks the field counts and fills the table from the parsed records.
TextTable table_from_records(std::vector<std::vector<std::string>> records,
                             std::vector<int64_t> lines, const std::string& path, bool header) {
  TextTable t;
  t.path = path;
  t.has_header = header;
  if (records.empty()) return t;
  size_t first = 0;
  if (header) {
    t.columns = std::move(records[0]);
    first = 1;
  } else {
    t.columns.assign(records[0].size(), "");
  }
  const size_t width = t.columns.size();
  t.rows.reserve(records.size() - first);
  for (size_t r = first; r < records.size(); ++r) {
    EMOE_CHECK(records[r].size() == width, InputError, "{}:{}: {} fields, expected {} (as the {})",
               path, lines[r], records[r].size(), width, header ? "header" : "first row");
    TextRow row;
    row.line = lines[r];
    row.fields = std::move(records[r]);
    row.kinds.assign(width, CellKind::kText);
    t.rows.push_back(std::move(row));
  }
  return t;
}

}  // namespace

std::string read_text_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  EMOE_CHECK(fs::exists(path, ec), InputError, "{}: not found", path);
  EMOE_CHECK(!fs::is_directory(path, ec), InputError, "{}: is a directory, expected a file", path);
  std::ifstream in(path, std::ios::binary);
  EMOE_CHECK(in.good(), InputError, "{}: cannot be opened for reading", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  EMOE_CHECK(!in.bad(), InputError, "{}: read error", path);
  std::string text = ss.str();
  if (text.rfind(kTableBom, 0) == 0) text.erase(0, 3);
  return text;
}

std::vector<std::string> read_lines(const std::string& path) {
  const std::string text = read_text_file(path);
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string l = text.substr(pos, end - pos);
    if (!l.empty() && l.back() == '\r') l.pop_back();
    lines.push_back(std::move(l));
    pos = end + 1;
  }
  return lines;
}

TextTable parse_delimited(const std::string& input, const std::string& path, char delimiter,
                          bool quoted, bool header) {
  std::string_view text(input);
  if (text.substr(0, 3) == kTableBom) text.remove_prefix(3);  // files lose it in read_text_file
  std::vector<std::vector<std::string>> records;
  std::vector<int64_t> lines;
  const size_t n = text.size();
  size_t i = 0;
  int64_t line = 1;
  while (i < n) {
    // Blank lines separate nothing: skip them.
    if (text[i] == '\n') {
      ++i, ++line;
      continue;
    }
    if (text[i] == '\r' && i + 1 < n && text[i + 1] == '\n') {
      i += 2, ++line;
      continue;
    }
    const int64_t record_line = line;
    std::vector<std::string> fields;
    while (true) {
      std::string field;
      if (quoted && i < n && text[i] == '"') {
        const int64_t quote_line = line;
        ++i;
        while (true) {
          EMOE_CHECK(i < n, InputError,
                     "{}:{}: quoted field is never closed (no matching '\"' before the end of the "
                     "file)",
                     path, quote_line);
          char c = text[i];
          if (c == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              field += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (c == '\n') ++line;
          field += c;
          ++i;
        }
        bool at_end = i >= n || text[i] == delimiter || text[i] == '\n' ||
                      (text[i] == '\r' && (i + 1 >= n || text[i + 1] == '\n'));
        EMOE_CHECK(
            at_end, InputError,
            "{}:{}: unexpected '{}' after a closing quote{}: expected the delimiter ({}) "
            "or the end of the line (write a quote inside a quoted field as \"\")",
            path, line, text[i],
            quote_line == line ? "" : fmt::format(" (the field began on line {})", quote_line),
            table_delimiter_name(delimiter));
        if (i < n && text[i] == '\r') ++i;
      } else {
        size_t start = i;
        while (i < n && text[i] != delimiter && text[i] != '\n') ++i;
        field.assign(text.substr(start, i - start));
        if (!field.empty() && field.back() == '\r' && (i >= n || text[i] == '\n')) field.pop_back();
      }
      fields.push_back(std::move(field));
      if (i < n && text[i] == delimiter) {
        ++i;
        continue;
      }
      if (i < n && text[i] == '\n') ++i, ++line;
      break;
    }
    records.push_back(std::move(fields));
    lines.push_back(record_line);
  }
  return table_from_records(std::move(records), std::move(lines), path, header);
}

TextTable read_delimited(const std::string& path, char delimiter, bool quoted, bool header) {
  return parse_delimited(read_text_file(path), path, delimiter, quoted, header);
}

TextTable read_jsonl(const std::string& path) {
  const std::vector<std::string> lines = read_lines(path);
  TextTable t;
  t.path = path;
  t.has_header = true;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& body = lines[i];
    const auto line = static_cast<int64_t>(i) + 1;
    if (table_trim(body).empty()) continue;
    nlohmann::ordered_json obj;
    try {
      obj = parse_json_limited<nlohmann::ordered_json>(fmt::format("{}:{}", path, line), body);
    } catch (const nlohmann::json::exception& e) {
      EMOE_THROW(InputError, "{}:{}: invalid JSON: {}", path, line, e.what());
    }
    EMOE_CHECK(obj.is_object(), InputError, "{}:{}: expected a JSON object per line, found {}",
               path, line, obj.type_name());
    TextRow row;
    row.line = line;
    row.fields.assign(t.columns.size(), "");
    row.kinds.assign(t.columns.size(), CellKind::kMissing);
    for (const auto& [key, value] : obj.items()) {
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, t.columns.size()).first;
        t.columns.push_back(key);
        row.fields.emplace_back();
        row.kinds.push_back(CellKind::kMissing);
      }
      if (value.is_null()) {
        row.kinds[it->second] = CellKind::kNull;
        continue;
      }
      row.fields[it->second] = value.is_string() ? value.get<std::string>() : value.dump();
      row.kinds[it->second] = value.is_string() ? CellKind::kText : CellKind::kJson;
    }
    t.rows.push_back(std::move(row));
  }
  // Rows read before a key first appeared lack it.
  for (auto& r : t.rows) {
    r.fields.resize(t.columns.size());
    r.kinds.resize(t.columns.size(), CellKind::kMissing);
  }
  return t;
}

std::string table_format(const std::string& path, const std::string& format) {
  if (!format.empty()) {
    EMOE_CHECK(format == "tsv" || format == "csv" || format == "jsonl", UsageError,
               "{}: table format '{}': expected tsv, csv or jsonl", path, format);
    return format;
  }
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".tsv" || ext == ".tab") return "tsv";
  if (ext == ".csv") return "csv";
  if (ext == ".jsonl" || ext == ".ndjson") return "jsonl";
  EMOE_THROW(UsageError,
             "{}: cannot tell the table format from the extension '{}': expected .tsv, .csv or "
             ".jsonl, or give the format (tsv, csv, jsonl)",
             path, ext);
}

size_t resolve_column(const TextTable& table, const std::string& column) {
  if (table.has_header)
    for (size_t i = 0; i < table.columns.size(); ++i)
      if (table.columns[i] == column) return i;
  bool numeric = !column.empty() && std::all_of(column.begin(), column.end(), [](unsigned char c) {
    return std::isdigit(c) != 0;
  });
  if (numeric) {
    size_t idx = std::stoull(column);
    EMOE_CHECK(idx < table.columns.size(), InputError,
               "{}: column index {} is out of range: the file has {} columns", table.path, idx,
               table.columns.size());
    return idx;
  }
  if (table.columns.empty())
    EMOE_THROW(InputError, "{}: column '{}' not found: the file has no rows", table.path, column);
  if (!table.has_header)
    EMOE_THROW(InputError,
               "{}: column '{}' not found: the file has no header, so columns are 0-based indices "
               "0..{}",
               table.path, column, table.columns.size() - 1);
  EMOE_THROW(InputError, "{}: column '{}' not found (columns: {})", table.path, column,
             table_join(table.columns));
}

const std::string& table_field(const TextTable& table, const TextRow& row, size_t column) {
  if (row.kinds[column] == CellKind::kMissing) {
    std::vector<std::string> keys;
    for (size_t i = 0; i < table.columns.size(); ++i)
      if (row.kinds[i] != CellKind::kMissing) keys.push_back(table.columns[i]);
    EMOE_THROW(InputError, "{}:{}: key '{}' missing (keys present: {})", table.path, row.line,
               table.columns[column], table_join(keys));
  }
  EMOE_CHECK(row.kinds[column] != CellKind::kNull, InputError, "{}:{}: key '{}': the value is null",
             table.path, row.line, table.columns[column]);
  return row.fields[column];
}

const std::string& table_text(const TextTable& table, const TextRow& row, size_t column) {
  const std::string& v = table_field(table, row, column);
  EMOE_CHECK(row.kinds[column] == CellKind::kText, InputError,
             "{}:{}: key '{}': expected text (a JSON string), got {}", table.path, row.line,
             table.columns[column], v.size() > 40 ? v.substr(0, 40) + "..." : v);
  return v;
}

double parse_label(const std::string& text, const TaskSpec& task,
                   const std::map<std::string, int64_t>& label_map, const std::string& path,
                   int64_t line) {
  const std::string v = table_trim(text);
  EMOE_CHECK(!v.empty(), InputError, "{}:{}: the label is empty", path, line);
  if (task.regression) {
    errno = 0;
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    EMOE_CHECK(end == v.c_str() + v.size() && errno == 0 && std::isfinite(x), InputError,
               "{}:{}: label '{}': expected a number (task {} is a regression)", path, line, v,
               task.name);
    return x;
  }
  int64_t id = 0;
  if (!label_map.empty()) {
    auto it = label_map.find(v);
    if (it == label_map.end()) {
      std::vector<std::string> keys;
      for (const auto& kv : label_map) keys.push_back("'" + kv.first + "'");
      EMOE_THROW(InputError, "{}:{}: label '{}' is not in the label map (expected one of {})", path,
                 line, v, table_join(keys));
    }
    id = it->second;
  } else {
    errno = 0;
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    // (an id beyond int64's range, 1e300, is not one: converting it would be undefined behaviour)
    bool integral = end == v.c_str() + v.size() && errno == 0 && std::isfinite(x) &&
                    x == std::floor(x) && std::fabs(x) < 0x1p63;
    auto named = std::find(task.labels.begin(), task.labels.end(), v);
    if (integral) {
      id = static_cast<int64_t>(x);
    } else if (named != task.labels.end()) {
      id = named - task.labels.begin();
    } else {
      EMOE_THROW(InputError, "{}:{}: label '{}': expected a class id 0..{} or one of {} (task {})",
                 path, line, v, task.num_labels() - 1, table_join(task.labels), task.name);
    }
  }
  EMOE_CHECK(id >= 0 && id < task.num_labels(), InputError,
             "{}:{}: label '{}' gives class id {}, outside 0..{} (task {}: {})", path, line, v, id,
             task.num_labels() - 1, task.name, table_join(task.labels));
  return static_cast<double>(id);
}

}  // namespace emoe

#include "layering.h"

#include <sstream>

#include "piper/base/strings.h"

namespace piper::layering {
namespace {

// "`strategy/schedules/`" -> "strategy/schedules"; "" when the cell is not one backquoted folder.
std::string folder_cell(const std::string& cell) {
  std::string t = trim(cell);
  if (t.size() < 4 || t.front() != '`' || t.back() != '`' || t[t.size() - 2] != '/') return "";
  return t.substr(1, t.size() - 3);
}

// "compile, cost (the trainer's prediction)" -> {"compile", "cost"}: parenthesised remarks are dropped.
std::vector<std::string> dependency_names(const std::string& cell) {
  std::string plain;
  int depth = 0;
  for (char c : cell) {
    if (c == '(') ++depth;
    else if (c == ')') --depth;
    else if (depth == 0 && c != '`') plain += c;
  }
  std::vector<std::string> names;
  for (const std::string& piece : split(plain, ',')) {
    std::string name = trim(piece);
    while (!name.empty() && name.back() == '/') name.pop_back();
    if (!name.empty() && name != "—" && name != "-") names.push_back(name);
  }
  return names;
}

// "spec, strategy (not ir: the closed form ...)" -> {"ir"}: the modules a remark starting with "not" names, up to
// its colon.
std::vector<std::string> forbidden_names(const std::string& cell) {
  std::vector<std::string> names;
  size_t open = cell.find('(');
  while (open != std::string::npos) {
    const size_t close = cell.find(')', open);
    std::string remark = trim(cell.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1));
    if (remark.rfind("not ", 0) == 0) {
      remark = remark.substr(4, remark.find(':') == std::string::npos ? std::string::npos : remark.find(':') - 4);
      for (const std::string& name : dependency_names(remark)) names.push_back(name);
    }
    open = close == std::string::npos ? close : cell.find('(', close);
  }
  return names;
}

Status check_acyclic(const ModuleTable& table) {
  for (const auto& [module, unused] : table.deps) {
    if (table.everything.count(module)) continue;
    if (allowed_includes(table, module).count(module)) {
      return invalid_argument("module table: '" + module + "' depends on itself through its dependencies; "
                              "dependencies must point one way");
    }
  }
  return Status();
}

}  // namespace

Result<ModuleTable> parse_module_table(const std::string& markdown) {
  ModuleTable table;
  std::map<std::string, std::vector<std::string>> listed;
  std::istringstream lines(markdown);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells = split(line, '|');  // "", folder, owns..., deps, ""
    std::string module = cells.size() >= 4 ? folder_cell(cells[1]) : "";
    if (module.empty()) continue;  // a table row of another table
    if (cells.size() < 5) return invalid_argument("module table: the row of '" + module + "' has no dependency cell");
    std::vector<std::string> names = dependency_names(cells[cells.size() - 2]);
    if (names.size() == 1 && names[0] == "everything") table.everything.insert(module);
    else listed[module] = names;
    table.deps[module];
    for (const std::string& name : forbidden_names(cells[cells.size() - 2])) table.direct_forbidden[module].insert(name);
  }
  for (const auto& [module, names] : table.direct_forbidden) {
    for (const std::string& name : names) {
      if (!table.deps.count(name)) {
        return invalid_argument("module table: the row of '" + module + "' says 'not " + name +
                                "', which is no row of the table; fix the name");
      }
    }
  }
  if (table.deps.empty()) return invalid_argument("module table: no row of the form | `folder/` | ... | deps | found");
  for (const auto& [module, names] : listed) {
    for (const std::string& name : names) {
      if (!table.deps.count(name)) {
        return invalid_argument("module table: the row of '" + module + "' lists '" + name +
                                "', which is no row of the table; add its row or fix the name");
      }
      table.deps[module].insert(name);
    }
  }
  PIPER_RETURN_IF_ERROR(check_acyclic(table));
  return table;
}

std::set<std::string> allowed_includes(const ModuleTable& table, const std::string& module) {
  std::set<std::string> seen;
  if (table.everything.count(module)) {
    for (const auto& [other, unused] : table.deps) seen.insert(other);
    return seen;
  }
  std::vector<std::string> todo;
  auto it = table.deps.find(module);
  if (it != table.deps.end()) todo.assign(it->second.begin(), it->second.end());
  while (!todo.empty()) {
    std::string next = todo.back();
    todo.pop_back();
    if (!seen.insert(next).second) continue;
    for (const std::string& dep : table.deps.at(next)) todo.push_back(dep);
  }
  if (auto no = table.direct_forbidden.find(module); no != table.direct_forbidden.end()) {
    for (const std::string& name : no->second) seen.erase(name);
  }
  return seen;
}

std::string module_of(const ModuleTable& table, const std::string& path) {
  std::string best;
  for (const auto& [module, unused] : table.deps) {
    if (path.rfind(module + "/", 0) == 0 && module.size() > best.size()) best = module;
  }
  return best;
}

std::vector<std::string> find_violations(const ModuleTable& table, const std::vector<SourceFile>& files) {
  const std::string prefix = "#include \"piper/";
  std::vector<std::string> out;
  for (const SourceFile& file : files) {
    std::string from = module_of(table, file.path);
    if (from.empty()) {
      out.push_back(file.path + ": in no module of the table; add the folder's row to docs/ARCHITECTURE.md");
      continue;
    }
    std::set<std::string> allowed = allowed_includes(table, from);
    std::istringstream lines(file.text);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      if (line.rfind(prefix, 0) != 0) continue;
      std::string header = line.substr(prefix.size(), line.find('"', prefix.size()) - prefix.size());
      std::string to = module_of(table, header);
      if (to == from || allowed.count(to)) continue;
      std::string may = allowed.empty() ? "nothing" : join(std::vector<std::string>(allowed.begin(), allowed.end()), ", ");
      out.push_back(file.path + ":" + std::to_string(n) + ": " + from + " -> " + (to.empty() ? header : to) +
                    " (`" + from + "/` may include: " + may + ")");
    }
  }
  return out;
}

}  // namespace piper::layering

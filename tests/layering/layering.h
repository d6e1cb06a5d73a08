// The module layering rule of docs/ARCHITECTURE.md, checked against the sources.
//
// parse_module_table() reads the "Modules" table and the runtime's folders' table: one row per folder under src/
// (`base/`, `strategy/schedules/`, `runtime/exec/`), whose last cell lists the modules it may include ("base, spec",
// "—" for none, "everything" for all); every row of the document whose first cell is one backquoted folder counts.
// A module may include its own headers, those of the modules it lists and, transitively, what they list
// (dependencies point one way). find_violations() reports every `#include "piper/<module>/..."` that breaks the rule; a file
// belongs to the longest folder of the table that contains it, and so does an included header. A remark that
// starts with "not" ("compile, cost (not ir: the simulator reads only the Plan)") forbids the module to include the
// named modules itself even where its dependencies reach them (they may; it may not).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "piper/base/status.h"

namespace piper::layering {

struct ModuleTable {
  std::map<std::string, std::set<std::string>> deps;  // module -> the modules its row lists
  std::set<std::string> everything;                   // modules whose row says "everything"
  std::map<std::string, std::set<std::string>> direct_forbidden;  // module -> modules its "(not ...)" remark names
};

struct SourceFile {
  std::string path;  // relative to src/, e.g. "comm/mesh.cc"
  std::string text;
};

// Errors: no table found, a row without three cells, a dependency that names no module of the table, or a cycle.
Result<ModuleTable> parse_module_table(const std::string& markdown);

// What `module` may include besides itself: its row's modules and theirs, transitively, less those its row's
// "(not ...)" remark names.
std::set<std::string> allowed_includes(const ModuleTable& table, const std::string& module);

// The module of a path relative to src/ ("strategy/schedules/dualpipev.cc" -> "strategy/schedules"); "" when no
// row of the table contains it.
std::string module_of(const ModuleTable& table, const std::string& path);

// One line per forbidden include ("comm/mesh.cc:7: comm -> strategy (`comm/` may include: base, spec)") and per
// file outside every row of the table.
std::vector<std::string> find_violations(const ModuleTable& table, const std::vector<SourceFile>& files);

}  // namespace piper::layering

// Small string utilities with strict parsing (no silent defaults on garbage).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "piper/base/status.h"

namespace piper {

std::vector<std::string> split(std::string_view text, char sep);  // keeps empty pieces
std::string trim(std::string_view text);
std::string join(const std::vector<std::string>& parts, const std::string& sep);
bool starts_with(std::string_view text, std::string_view prefix);
bool ends_with(std::string_view text, std::string_view suffix);
std::string to_lower(std::string_view text);

// Whole-string parses; `what` names the value in the error ("--nodes", "strategy key dp").
Result<int64_t> parse_int(std::string_view text, const std::string& what);
Result<double> parse_double(std::string_view text, const std::string& what);

// Levenshtein distance, for "did you mean" hints.
int edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `word` if it is close enough to be a plausible typo, else "".
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace piper

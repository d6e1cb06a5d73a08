// Reading and writing the files a user names, safely.
//
// read_regular_file() stats a path before opening it and refuses anything that is not a regular file: a
// directory, a FIFO, a socket or a device would otherwise block forever (a FIFO with no writer) or be reported
// as malformed content. write_file_atomic() never leaves a partial file behind: it writes a temporary in the
// target's directory, flushes it to disk and renames it over the target, so a reader sees the old file or the
// whole new one, and a failed write leaves no file at all. elide() shortens a user's value for a message.
// Thread-safety: the functions share no state.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "piper/base/status.h"

namespace piper {

// The whole file at `path`. Errors: missing (kNotFound), a directory or another non-regular file
// (kInvalidArgument, naming the kind: "is a directory", "is not a regular file (a FIFO?)"), read errors
// (kDataLoss). `what` names the input in messages ("--data", "model file"); empty: just the path.
Result<std::string> read_regular_file(const std::string& path, const std::string& what = "");

// Checks that `path` can be read as a regular file (same errors as read_regular_file) without reading it.
Status check_regular_file(const std::string& path, const std::string& what = "");

// Writes `bytes` to `path` atomically: temporary `path`.tmp.<pid> in the same directory, fsync, rename.
// On any error the temporary is removed and `path` is left as it was.
Status write_file_atomic(const std::string& path, std::string_view bytes);

// `value` if it has at most `max_chars` characters, else its first `max_chars` characters followed by
// "... (N bytes)": a user's long input (a 100 KB strategy string) is never echoed in full in a message.
inline constexpr size_t kElideChars = 80;
std::string elide(std::string_view value, size_t max_chars = kElideChars);
// Every run of more than kElideLongWord non-space characters in `message` elided as above: the CLI's last
// guard against a message that quotes a huge input (messages' own words are far shorter).
inline constexpr size_t kElideLongWord = 200;
std::string elide_long_words(std::string_view message);

}  // namespace piper

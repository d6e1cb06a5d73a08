#include "piper/base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace piper {
namespace {

std::string label(const std::string& path, const std::string& what) {
  return what.empty() ? "'" + elide(path) + "'" : what + " '" + elide(path) + "'";
}

const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

}  // namespace

Status check_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return not_found(label(path, what) + " does not exist; check the path");
    return not_found("cannot open " + label(path, what) + ": " + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) return invalid_argument(label(path, what) + " is a directory; give a file");
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument(label(path, what) + " is not a regular file (" + file_kind(st.st_mode) +
                            "); give a regular file");
  }
  return ok_status();
}

Result<std::string> read_regular_file(const std::string& path, const std::string& what) {
  PIPER_RETURN_IF_ERROR(check_regular_file(path, what));
  // O_NONBLOCK: should the path be swapped for a FIFO between the stat and the open, the open does not block.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return not_found("cannot open " + label(path, what) + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(label(path, what) + " is not a regular file; give a regular file");
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return data_loss("error reading " + label(path, what) + ": " + std::strerror(err));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status write_file_atomic(const std::string& path, std::string_view bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return invalid_argument("cannot write '" + elide(path) + "': it is a directory; give a file name");
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return not_found("cannot write '" + elide(path) + "': " + std::strerror(errno));
  size_t done = 0;
  int err = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    std::remove(tmp.c_str());
    return data_loss("error writing '" + elide(path) + "': " + std::strerror(err) + "; nothing was written");
  }
  return ok_status();
}

std::string elide(std::string_view value, size_t max_chars) {
  if (value.size() <= max_chars) return std::string(value);
  return std::string(value.substr(0, max_chars)) + "... (" + std::to_string(value.size()) + " bytes)";
}

std::string elide_long_words(std::string_view message) {
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    size_t j = i;
    const bool space = message[i] == ' ';
    while (j < message.size() && (message[j] == ' ') == space) ++j;
    const std::string_view run = message.substr(i, j - i);
    out += !space && run.size() > kElideLongWord ? elide(run) : std::string(run);
    i = j;
  }
  return out;
}

}  // namespace piper

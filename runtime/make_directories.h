// The one way tilejit (the disk cache) and its tool (--save-inputs) create
// directories.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>

namespace tilejit::runtime {

// Makes `dir` and its missing parents with mode 0755 (less under a stricter
// umask). create_directories used the process's umask alone: under umask 0
// the cache was drwxrwxrwx, where any user could delete or flood entries (an
// outside review). Existing directories are left as they are; the caller
// checks that `dir` is one at the end (a file in its place is not an error
// here). An empty error_code: done.
inline std::error_code make_directories(const std::string& dir) {
  std::filesystem::path prefix;
  for (const std::filesystem::path& part : std::filesystem::path(dir)) {
    prefix /= part;
    if (part.empty() || part.has_root_directory() || part == "." || part == "..") continue;
    if (::mkdir(prefix.c_str(), 0755) == 0 || errno == EEXIST) continue;
    // An existing directory can still fail with another errno first (EROFS,
    // EACCES in a parent this user cannot write).
    const int e = errno;
    struct stat sb;
    if (::stat(prefix.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) continue;
    return std::error_code(e, std::generic_category());
  }
  return {};
}

}  // namespace tilejit::runtime

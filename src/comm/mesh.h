// Mesh: ranks <-> coordinates on named axes (dp/tp/pp/ep ...), innermost (fastest-varying) axis first, and the
// communicators of mesh axes.
//
// rank = c0 + s0 * (c1 + s1 * (c2 + ...)) for axes (a0, a1, a2, ...) with sizes (s0, s1, ...). With the
// Strategy's default order tp-ep-dp-pp, tensor-parallel peers are adjacent ranks (same node) and pipeline
// stages are the farthest apart.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

class Mesh {
 public:
  // Axis names must be unique and non-empty, sizes positive.
  static Result<Mesh> create(std::vector<std::string> axes, std::vector<int> sizes);

  int size() const { return size_; }
  const std::vector<std::string>& axes() const { return axes_; }
  const std::vector<int>& sizes() const { return sizes_; }
  Result<int> axis_index(const std::string& axis) const;  // error lists the known axes

  std::vector<int> coords(int rank) const;  // precondition: 0 <= rank < size()
  int rank_of(const std::vector<int>& coords) const;
  // Ranks sharing every coordinate of `rank` except those on `axes`, in increasing rank order.
  Result<std::vector<int>> group(int rank, const std::vector<std::string>& axes) const;
  // "ep[tp=0,dp=1,pp=0]": the axes joined by '+', then the fixed coordinates.
  std::string group_name(int rank, const std::vector<std::string>& axes) const;

 private:
  std::vector<std::string> axes_;
  std::vector<int> sizes_;
  int size_ = 1;
};

// Collective over `world` (whose size must equal mesh.size()): the communicator along `axes` through this rank.
Result<std::unique_ptr<Communicator>> mesh_communicator(Communicator& world, const Mesh& mesh,
                                                        const std::vector<std::string>& axes);

}  // namespace piper::comm

#include "piper/comm/mesh.h"

#include <set>

#include "piper/base/check.h"
#include "piper/base/strings.h"

namespace piper::comm {

Result<Mesh> Mesh::create(std::vector<std::string> axes, std::vector<int> sizes) {
  if (axes.size() != sizes.size() || axes.empty()) {
    return invalid_argument("mesh: need one size per axis and at least one axis; got " + std::to_string(axes.size()) +
                            " axes and " + std::to_string(sizes.size()) + " sizes");
  }
  std::set<std::string> seen;
  Mesh mesh;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i].empty()) return invalid_argument("mesh: axis " + std::to_string(i) + " has an empty name");
    if (!seen.insert(axes[i]).second) return invalid_argument("mesh: axis '" + axes[i] + "' appears twice");
    if (sizes[i] < 1) {
      return invalid_argument("mesh: axis '" + axes[i] + "' has size " + std::to_string(sizes[i]) +
                              "; sizes must be >= 1");
    }
    mesh.size_ *= sizes[i];
  }
  mesh.axes_ = std::move(axes);
  mesh.sizes_ = std::move(sizes);
  return mesh;
}

Result<int> Mesh::axis_index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i] == axis) return static_cast<int>(i);
  }
  return invalid_argument("mesh: unknown axis '" + axis + "'; the mesh has axes " + join(axes_, ", "));
}

std::vector<int> Mesh::coords(int rank) const {
  PIPER_CHECK(rank >= 0 && rank < size_, "rank ", rank, " outside mesh of size ", size_);
  std::vector<int> c(sizes_.size());
  for (size_t i = 0; i < sizes_.size(); ++i) {
    c[i] = rank % sizes_[i];
    rank /= sizes_[i];
  }
  return c;
}

int Mesh::rank_of(const std::vector<int>& coords) const {
  PIPER_CHECK(coords.size() == sizes_.size());
  int rank = 0;
  for (size_t i = sizes_.size(); i-- > 0;) {
    PIPER_CHECK(coords[i] >= 0 && coords[i] < sizes_[i]);
    rank = rank * sizes_[i] + coords[i];
  }
  return rank;
}

Result<std::vector<int>> Mesh::group(int rank, const std::vector<std::string>& axes) const {
  if (rank < 0 || rank >= size_) {
    return invalid_argument("mesh: rank " + std::to_string(rank) + " outside [0, " + std::to_string(size_) + ")");
  }
  std::vector<bool> free(axes_.size(), false);
  for (const std::string& a : axes) {
    PIPER_ASSIGN_OR_RETURN(int i, axis_index(a));
    free[i] = true;
  }
  std::vector<int> mine = coords(rank);
  std::vector<int> members;
  for (int r = 0; r < size_; ++r) {
    std::vector<int> c = coords(r);
    bool same = true;
    for (size_t i = 0; i < c.size() && same; ++i) same = free[i] || c[i] == mine[i];
    if (same) members.push_back(r);
  }
  return members;
}

std::string Mesh::group_name(int rank, const std::vector<std::string>& axes) const {
  std::vector<int> c = coords(rank);
  std::vector<std::string> fixed;
  for (size_t i = 0; i < axes_.size(); ++i) {
    bool is_free = false;
    for (const std::string& a : axes) is_free = is_free || a == axes_[i];
    if (!is_free) fixed.push_back(axes_[i] + "=" + std::to_string(c[i]));
  }
  return join(axes, "+") + "[" + join(fixed, ",") + "]";
}

Result<std::unique_ptr<Communicator>> mesh_communicator(Communicator& world, const Mesh& mesh,
                                                        const std::vector<std::string>& axes) {
  if (world.size() != mesh.size()) {
    return invalid_argument("mesh: the mesh has " + std::to_string(mesh.size()) + " ranks but communicator '" +
                            world.name() + "' has " + std::to_string(world.size()) +
                            "; the product of the axis sizes must equal the number of ranks");
  }
  PIPER_ASSIGN_OR_RETURN(std::vector<int> members, mesh.group(world.rank(), axes));
  return world.split(members, mesh.group_name(world.rank(), axes));
}

}  // namespace piper::comm

// Training checkpoints: written by every rank of a run, loadable under any other strategy and world size.
//
// Layout of a checkpoint root ROOT (`piper train --save ROOT`):
//   ROOT/latest                        names the newest complete checkpoint ("step-00000012"); replaced by rename
//   ROOT/step-00000012/index.json      format/version, step, data position, RNG state, seq_len, model name, the
//                                      writer's strategy and world size; per file its bytes and fnv1a64 of the
//                                      data section; per tensor its global shape and the pieces that hold it
//   ROOT/step-00000012/rank-00003.safetensors   the pieces rank 3 wrote (no file for a rank that wrote none)
// Tensors are named globally: parameters "L1.attn.wq", AdamW moments "L1.attn.wq.m" / ".v". A piece is a part
// of one tensor: a box of it (the slice a rank holds: an EP rank's experts, a TP slice; offset and extent per
// dimension) and a flat range [begin, end) of that box in row-major order (a ZeRO shard of the moments). Ranks
// that hold the very same piece (data-parallel replicas) write it once: the lowest such rank does.
//
// Saving is collective over the run's ranks: each rank writes its file into ROOT/step-N.tmp/ and fsyncs it;
// then rank 0 writes and fsyncs the index, renames the directory to ROOT/step-N and replaces ROOT/latest through
// a rename (fsyncing ROOT). A crash at any point leaves the previous checkpoint and `latest` intact; the next
// save removes the stale .tmp directory. The newest `keep` checkpoints up to this step are kept, older ones
// removed. All ranks must see ROOT on a shared file system (one machine: trivially).
//
// Loading: CheckpointReader::open resolves ROOT through `latest` (or takes ROOT itself when it holds an
// index.json) and validates the index. restore() assembles any box of a tensor from whichever pieces cover it,
// so a checkpoint written under one strategy (pp/dp/ep/tp/ZeRO, any world size) loads under another. Files
// are read on first use and checked against the index's size and checksum and against the pieces it lists; any
// mismatch is DataLoss naming the file; a missing checkpoint is NotFound naming ROOT.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"
#include "piper/runtime/data_loader.h"
#include "piper/tensor/rng.h"
#include "piper/tensor/tensor.h"

namespace piper {

struct CheckpointMeta {
  int64_t step = 0;   // optimizer steps completed
  DataPosition data;  // where the data loader resumes
  RngState rng;       // the trainer's RNG (its seed drives the data order)
  int64_t seq_len = 0;
  std::string model;     // model name, for messages
  std::string strategy;  // the writer's strategy (compact form), for messages
  int world_size = 1;    // ranks that wrote it
  // Expert-parallel writers: per MoE layer, the logical expert in each physical expert slot (slot s on ep rank
  // s / (num_experts / ep)). Experts are stored by logical index whatever this table says, so the table is
  // informational for readers with another placement; a reader that migrates experts adopts it. Empty otherwise.
  std::map<int, std::vector<int>> expert_placement;
};

// The part of global tensor `name` this rank holds: flat elements [begin, end) (end = -1: to the end) of the box
// at `offset` (one entry per dimension of global_shape; empty = all zeros). With `extent` empty, `local` is the
// whole box (its shape is the extent); with `extent` set, `local` holds only elements [begin, end) of that box
// (a truly sharded store, e.g. ZeRO moments allocated for the shard only). `optimizer` marks optimizer state
// (read back as MemCategory::kOptimizer).
struct TensorPiece {
  std::string name;
  Shape global_shape;
  Shape offset;
  const Tensor* local = nullptr;
  int64_t begin = 0, end = -1;
  bool optimizer = false;
  Shape extent = {};
};

// Collective over `world` (nullptr: a one-rank run): every rank passes its pieces. Returns on every rank the
// same status: an error names the rank and the file that failed. InvalidArgument for inconsistent pieces (two
// ranks disagree on a tensor's global shape, a box outside its tensor, partly overlapping pieces).
// Waits at most timeout_s for the other ranks at each exchange (DeadlineExceeded naming the missing ranks).
Status save_checkpoint(const std::string& root, const CheckpointMeta& meta, const std::vector<TensorPiece>& pieces,
                       comm::Communicator* world, double timeout_s, int keep = 2);

// The directory name of the checkpoint of `step` ("step-00000012").
std::string checkpoint_step_name(int64_t step);

class CheckpointReader {
 public:
  struct PieceRef {
    std::string file, key;  // rank file and tensor name in it
    Shape offset, extent;
    int64_t begin = 0, end = 0;
  };
  struct TensorInfo {
    Shape shape;
    bool optimizer = false;
    std::vector<PieceRef> pieces;
  };

  // NotFound when ROOT has neither `latest` nor index.json; DataLoss for a corrupt index.
  static Result<std::unique_ptr<CheckpointReader>> open(const std::string& root);
  // The same from the text of an index already read: `dir` is the step directory its files are read from (on
  // first use), `path` names the index in messages.
  static Result<std::unique_ptr<CheckpointReader>> from_index_text(const std::string& text, const std::string& dir,
                                                                   const std::string& path);

  const std::string& dir() const { return dir_; }  // the resolved step directory
  const CheckpointMeta& meta() const { return meta_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }

  // Fills `dst` with the box of tensor `name` at `offset` (empty = zeros) whose extent is dst->shape().
  // InvalidArgument naming the tensor if it is absent or its global shape differs from `global_shape`;
  // DataLoss naming the file if a piece's file is corrupt or the pieces do not cover the box exactly once.
  Status restore(const std::string& name, const Shape& global_shape, const Shape& offset, Tensor* dst);
  // Fills `dst` (end - begin floats) with flat elements [begin, end) of the box at `offset` of extent `extent`
  // (a shard store: TensorPiece::extent). Only those elements must be covered.
  Status restore_range(const std::string& name, const Shape& global_shape, const Shape& offset, const Shape& extent,
                       int64_t begin, int64_t end, float* dst);

 private:
  CheckpointReader() = default;
  Result<const Tensor*> piece_data(const PieceRef& piece, bool optimizer);
  std::string dir_;
  CheckpointMeta meta_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::pair<uint64_t, std::string>> files_;  // name -> (bytes, fnv1a64 hex)
  std::map<std::string, std::map<std::string, Tensor>> loaded_;     // files read so far
};

// Collective helpers over `world` (nullptr: one rank; they return at once).
// Every rank's `mine`, in rank order, on every rank.
Result<std::vector<std::string>> all_gather_strings(comm::Communicator* world, const std::string& mine,
                                                    double timeout_s);
// The same status on every rank: the first failed rank's error (with "rank R: "), else OK.
Status agree_on_status(comm::Communicator* world, const Status& mine, double timeout_s);

}  // namespace piper

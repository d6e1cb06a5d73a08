// Training checkpoints: written by every rank of a run, loadable under any other strategy and world size, and
// never loaded wrong: every field and byte that a resume relies on is checked, and a mismatch is refused with a
// message that says which (file, tensor, expected vs found) and what to do.
//
// Layout of a checkpoint root ROOT (`piper train --save ROOT`):
//   ROOT/latest                        names the newest complete checkpoint ("step-00000012"); replaced by rename
//   ROOT/step-00000012/index.json      format "piper-checkpoint", version 3; step, data position, RNG state,
//                                      seq_len; the model's identity (name, the shape-determining ModelSpec
//                                      fields and their hash); the writer's strategy and world size; per file its
//                                      bytes and the fnv1a64 of the whole file; per tensor its dtype, global shape
//                                      and the pieces that hold it, each with its header entry's data_offsets
//                                      and a checksum over that entry (name, dtype, shape, offsets) and its data;
//                                      last, index_fnv1a64 over the rest of the index
//   ROOT/step-00000012/rank-00003.safetensors   the pieces rank 3 wrote (no file for a rank that wrote none)
// Tensors are named globally: parameters "L1.attn.wq", AdamW moments "L1.attn.wq.m" / ".v". A piece is a part
// of one tensor: a box of it (the slice a rank holds: an EP rank's experts, a TP slice; offset and extent per
// dimension) and a flat range [begin, end) of that box in row-major order (a ZeRO shard of the moments). Ranks
// that hold the very same piece (data-parallel replicas) write it once: the lowest such rank does.
//
// Saving is collective over the run's ranks: rank 0 creates ROOT/step-N.tmp/; each rank writes its file into it
// and fsyncs it; the ranks agree (agree_on_status) and exchange their files' checksums; rank 0 writes and fsyncs
// the index, fsyncs the directory, renames it to ROOT/step-N, fsyncs ROOT and replaces ROOT/latest through a
// rename. A crash or kill at any point leaves the previous checkpoint and `latest` intact; the next save removes
// the stale .tmp directory. The newest `keep` checkpoints up to this step are kept, older ones removed. All ranks
// must see ROOT on a shared file system (one machine: trivially).
//
// Loading: CheckpointReader::open resolves ROOT through `latest` (or takes ROOT itself when it holds an
// index.json) and validates the whole index (version, known keys only, ranges, its checksum): DataLoss naming
// the index and the field. restore() assembles any box of a tensor from whichever pieces cover it, so a
// checkpoint written under one strategy (pp/dp/ep/tp/ZeRO, any world size) loads under another. Files are read
// on first use; their size, each header entry (dtype, shape, offsets) and each piece's checksum are checked
// against the index, then the whole file's: a mismatch is DataLoss naming the file, the tensor and expected vs
// found. check_checkpoint_model refuses a checkpoint of another architecture. Old versions are refused
// (Unimplemented naming both versions): they lack the model identity and the header checksums.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"
#include "piper/runtime/data/data_loader.h"
#include "piper/spec/model_spec.h"
#include "piper/tensor/rng.h"
#include "piper/tensor/tensor.h"

namespace piper {

struct CheckpointMeta {
  int64_t step = 0;   // optimizer steps completed
  DataPosition data;  // where the data loader resumes
  RngState rng;       // the trainer's RNG (its seed drives the data order)
  int64_t seq_len = 0;
  std::string model;     // model name, for messages (model_arch is the identity)
  std::string strategy;  // the writer's strategy (compact form), for messages
  int world_size = 1;    // ranks that wrote it
  // Expert-parallel writers: per MoE layer, the logical expert in each physical expert slot (slot s on ep rank
  // s / (num_experts / ep)). Experts are stored by logical index whatever this table says, so the table is
  // informational for readers with another placement; a reader that migrates experts adopts it. Empty otherwise.
  std::map<int, std::vector<int>> expert_placement;
  // The model's identity: the ModelSpec fields that determine tensor shapes, field -> its value as JSON text
  // (model_architecture). Recorded with their hash; check_checkpoint_model compares them.
  std::map<std::string, std::string> model_arch;
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

// The fields of `model` that determine its tensors' shapes, each as JSON text ("num_layers" -> "2",
// "attention" -> "\"standard\""), and their hash (16 hex digits). A name is not part of the architecture.
std::map<std::string, std::string> model_architecture(const ModelSpec& model);
std::string architecture_hash(const std::map<std::string, std::string>& arch);

// InvalidArgument "... was written for another model ..." naming both models and the fields that differ when
// the checkpoint's architecture is not `model`'s. Same architecture under another name: OK (a renamed preset).
Status check_checkpoint_model(const std::string& dir, const CheckpointMeta& meta, const ModelSpec& model);

// Collective over `world` (nullptr: one rank): checks before training that every rank can write into ROOT
// (created if missing) by creating and removing a probe file. InvalidArgument naming ROOT and the errno text.
Status check_checkpoint_root_writable(const std::string& root, comm::Communicator* world, double timeout_s);

class CheckpointReader {
 public:
  struct PieceRef {
    std::string file, key;  // rank file and tensor name in it
    Shape offset, extent;
    int64_t begin = 0, end = 0;
    uint64_t data_begin = 0, data_end = 0;  // the header entry's data_offsets
    std::string checksum;                   // safetensors_entry_checksum, 16 hex digits
  };
  struct TensorInfo {
    Shape shape;
    std::string dtype = "F32";
    bool optimizer = false;
    std::vector<PieceRef> pieces;
  };
  struct FileInfo {
    uint64_t bytes = 0;
    std::string checksum;  // fnv1a64 of the whole file, 16 hex digits
  };

  // NotFound when ROOT has neither `latest` nor index.json; DataLoss for a corrupt or edited index;
  // Unimplemented for another format version or dtype.
  static Result<std::unique_ptr<CheckpointReader>> open(const std::string& root);

  const std::string& dir() const { return dir_; }  // the resolved step directory
  const CheckpointMeta& meta() const { return meta_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }

  // Fills `dst` with the box of tensor `name` at `offset` (empty = zeros) whose extent is dst->shape().
  // InvalidArgument naming the tensor if it is absent or its global shape differs from `global_shape` (expected
  // vs found); DataLoss naming the file and tensor if a piece's file is missing, truncated or does not match the
  // index, or if the pieces do not cover the box exactly once.
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
  std::map<std::string, FileInfo> files_;
  std::map<std::string, std::map<std::string, Tensor>> loaded_;     // files read so far
};

// Collective helpers over `world` (nullptr: one rank; they return at once).
// Every rank's `mine`, in rank order, on every rank.
Result<std::vector<std::string>> all_gather_strings(comm::Communicator* world, const std::string& mine,
                                                    double timeout_s);
// The same status on every rank: the first failed rank's error (with "rank R: "), else OK.
Status agree_on_status(comm::Communicator* world, const Status& mine, double timeout_s);

}  // namespace piper

// The executor core's communication (multi-rank programs; see executor_impl.h and docs/runtime.md): the bounded
// wait every handler's exchange goes through, the global gradient norm and the step's loss over the ranks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <type_traits>

#include "piper/base/fault.h"
#include "piper/kernels/cpu/optimizer.h"
#include "piper/runtime/exec/executor_handlers.h"

namespace piper::runtime {

using detail::Core;

Status Core::wait_comm(comm::Communicator& c, comm::Handle& h, std::shared_ptr<const void> keep,
                       const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    PIPER_ASSIGN_OR_RETURN(bool done, c.test(h));
    if (done) return ok_status();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Status live = comm::peer_liveness();
    if (stop || !live.ok() || waited > dist->timeout_s()) {
      Status st = ok_status();
      if (stop) {
        st = unavailable(what + ": abandoned, another stream of this rank failed");
      } else if (!live.ok()) {
        st = live.with_context(what + " on rank " + std::to_string(dist->rank()));
      } else {
        st = deadline_exceeded(what + " on rank " + std::to_string(dist->rank()) + " made no progress for " +
                               std::to_string(static_cast<int>(waited)) +
                               " s (PIPER_COMM_TIMEOUT_S): " + c.stalled_error(h, waited).message());
      }
      std::lock_guard<std::mutex> lock(mu);
      abandoned.push_back(std::move(keep));  // MPI may still touch it
      return st.ok() ? ok_status() : st;
    }
    // Ranks share few cores with their own compute threads: back off to sleeping, in proportion to the time
    // waited (comm::idle_while_polling), so that a stream waiting for a peer does not steal the core that peer
    // needs, nor sleeps through the rounds of a collective that its peers have finished.
    comm::idle_while_polling(waited);
  }
}

Result<double> Core::global_grad_norm() {
  double local = 0;
  for (const auto& c : model->chunks()) {
    // The first handler that holds the chunk's gradient in its own form (tp slices, ZeRO shards, experts) counts
    // this rank's share; a whole gradient counts on the rank create() chose.
    std::optional<double> share;
    for (detail::Handler* h : handlers) {
      share = h->grad_sq(*c);
      if (share) break;
    }
    if (share) {
      local += *share;
    } else if (auto it = norm_owner.find(c.get()); it != norm_owner.end() && it->second) {
      local += Optimizer::grad_sq(*c);
    }
  }
  auto all = std::make_shared<std::vector<double>>(static_cast<size_t>(dist->world_size()));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, dist->ctl().all_gather(&local, all->data(), sizeof(double)));
  PIPER_RETURN_IF_ERROR(wait_comm(dist->ctl(), h, all, "gradient norm exchange"));
  double sum = 0;
  for (double v : *all) sum += v;  // rank order: the same bits on every rank
  return std::sqrt(sum);
}

// Routers with a balancing bias (moe.router_bias) count the tokens their own rank routed: its dp replica's
// microbatches and, under sequence parallelism, its tp slice. The bias must follow the whole batch's loads, as on
// one rank, so before any update the counts are summed over every rank in rank order (one slot per layer, zero
// where a rank holds no such router; exact integers, the same sum on every rank). Without sequence parallelism the
// tensor ranks route the same tokens: only tp rank 0 contributes.
Status Core::sum_bias_counts() {
  if (!model->dims().expert_bias) return ok_status();
  const size_t E = static_cast<size_t>(model->dims().num_experts), slots = static_cast<size_t>(plan->num_layers) * E;
  const bool contributes = tp->token_shards() > 1 || dist->coord().tp == 0;
  auto mine = std::make_shared<std::vector<double>>(slots, 0.0);
  std::vector<std::pair<std::vector<int64_t>*, size_t>> routers;  // counts, first slot
  for (const auto& c : model->chunks()) {
    std::vector<int64_t>* counts = c->bias_counts();
    if (counts == nullptr || counts->size() != E || c->layer() < 0 || c->layer() >= plan->num_layers) continue;
    const size_t at = static_cast<size_t>(c->layer()) * E;
    routers.emplace_back(counts, at);
    for (size_t e = 0; e < E && contributes; ++e) (*mine)[at + e] = static_cast<double>((*counts)[e]);
  }
  const size_t world = static_cast<size_t>(dist->world_size());
  auto all = std::make_shared<std::vector<double>>(world * slots);
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, dist->ctl().all_gather(mine->data(), all->data(), slots * sizeof(double)));
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(mine), decltype(all)>>(mine, all);
  PIPER_RETURN_IF_ERROR(wait_comm(dist->ctl(), h, keep, "expert-load exchange of the balancing-bias routers"));
  for (auto& [counts, at] : routers) {
    for (size_t e = 0; e < E; ++e) {
      double sum = 0;
      for (size_t r = 0; r < world; ++r) sum += (*all)[r * slots + at + e];  // rank order
      (*counts)[e] = static_cast<int64_t>(sum);
    }
  }
  return ok_status();
}

Status Core::reduce_losses(double* loss, double* aux) {
  // Ranks of one tensor-parallel group see the same tokens: only tp rank 0 reports. With sequence parallelism
  // each sees a slice: the loss is the mean of the slices' means and the aux losses are parts of one sum. A head
  // split over tp (vocabulary parallel) sees every token and computes the same loss on every tensor rank: tp rank 0
  // reports it (loss_shards() = 1), while the routers' aux losses stay per slice.
  const int shards = tp->loss_shards();
  const bool reports_loss = dist->coord().tp == 0 || shards > 1;
  const bool reports_aux = dist->coord().tp == 0 || tp->token_shards() > 1;
  double local[2] = {0, 0};
  for (int k = 0; k < num_mb; ++k) {
    if (reports_loss) local[0] += loss_mb[static_cast<size_t>(k)];
    if (reports_aux) local[1] += aux_mb[static_cast<size_t>(k)];
  }
  auto all = std::make_shared<std::vector<double>>(2 * static_cast<size_t>(dist->world_size()));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, dist->ctl().all_gather(local, all->data(), sizeof(local)));
  PIPER_RETURN_IF_ERROR(wait_comm(dist->ctl(), h, all, "loss exchange"));
  double sum_loss = 0, sum_aux = 0;
  for (int r = 0; r < dist->world_size(); ++r) {
    sum_loss += (*all)[2 * static_cast<size_t>(r)];
    sum_aux += (*all)[2 * static_cast<size_t>(r) + 1];
  }
  const double dp = std::max(1, plan->mesh.dp);
  *loss = sum_loss / (dp * num_mb * shards);
  *aux = sum_aux / dp;
  return ok_status();
}

}  // namespace piper::runtime

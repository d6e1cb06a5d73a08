#include "piper/planner/milp.h"

#include <algorithm>
#include <cmath>

#if PIPER_HAVE_CBC
#include <coin/Cbc_C_Interface.h>
#endif

namespace piper::planner {

int MilpProblem::add_column(const std::string& name, double cost_per_unit, double lo, double hi, bool is_integer) {
  cost.push_back(cost_per_unit);
  lower.push_back(lo);
  upper.push_back(hi);
  integer.push_back(is_integer ? 1 : 0);
  names.push_back(name);
  return num_columns() - 1;
}

void MilpProblem::add_row(const std::string& name, std::vector<int> cols, std::vector<double> coefs, Sense sense,
                          double rhs) {
  rows.push_back(Row{std::move(cols), std::move(coefs), sense, rhs, name});
}

Status MilpProblem::validate() const {
  const size_t n = cost.size();
  if (lower.size() != n || upper.size() != n || integer.size() != n || names.size() != n) {
    return invalid_argument("milp: column arrays have different sizes");
  }
  if (n == 0) return invalid_argument("milp: the problem has no columns");
  for (size_t j = 0; j < n; ++j) {
    if (!(lower[j] <= upper[j])) {
      return invalid_argument("milp: column " + names[j] + " has lower bound above upper bound");
    }
  }
  for (const auto& r : rows) {
    if (r.cols.size() != r.coefs.size()) return invalid_argument("milp: row " + r.name + " has mismatched arrays");
    for (int c : r.cols) {
      if (c < 0 || c >= num_columns()) {
        return invalid_argument("milp: row " + r.name + " names column " + std::to_string(c) + " which does not exist");
      }
    }
  }
  return ok_status();
}

double MilpProblem::objective_of(const std::vector<double>& x) const {
  double z = 0;
  for (size_t j = 0; j < cost.size(); ++j) z += cost[j] * x[j];
  return z;
}

double MilpProblem::max_violation(const std::vector<double>& x) const {
  double worst = 0;
  for (size_t j = 0; j < cost.size(); ++j) {
    worst = std::max({worst, lower[j] - x[j], x[j] - upper[j]});
    if (integer[j]) worst = std::max(worst, std::abs(x[j] - std::round(x[j])));
  }
  for (const auto& r : rows) {
    double lhs = 0;
    for (size_t k = 0; k < r.cols.size(); ++k) lhs += r.coefs[k] * x[static_cast<size_t>(r.cols[k])];
    if (r.sense != Sense::kGreaterEqual) worst = std::max(worst, lhs - r.rhs);
    if (r.sense != Sense::kLessEqual) worst = std::max(worst, r.rhs - lhs);
  }
  return worst;
}

bool have_cbc() { return PIPER_HAVE_CBC != 0; }

#if PIPER_HAVE_CBC
namespace {

class CbcSolver final : public MilpSolver {
 public:
  explicit CbcSolver(double time_limit_s) : time_limit_s_(time_limit_s) {}
  const char* name() const override { return "cbc"; }

  Result<MilpSolution> solve(const MilpProblem& p) const override {
    PIPER_RETURN_IF_ERROR(p.validate());
    Cbc_Model* model = Cbc_newModel();
    Cbc_setLogLevel(model, 0);
    Cbc_setMaximumSeconds(model, time_limit_s_);
    Cbc_setAllowableGap(model, 0);
    Cbc_setAllowableFractionGap(model, 0);
    for (int j = 0; j < p.num_columns(); ++j) {
      Cbc_addCol(model, p.names[j].c_str(), p.lower[j], p.upper[j], p.cost[j], p.integer[j], 0, nullptr, nullptr);
    }
    for (const auto& r : p.rows) {
      const char sense = r.sense == MilpProblem::Sense::kLessEqual      ? 'L'
                         : r.sense == MilpProblem::Sense::kGreaterEqual ? 'G'
                                                                        : 'E';
      Cbc_addRow(model, r.name.c_str(), static_cast<int>(r.cols.size()), r.cols.data(), r.coefs.data(), sense, r.rhs);
    }
    Cbc_setObjSense(model, 1);  // minimise
    Cbc_solve(model);
    MilpSolution out;
    Status status = ok_status();
    if (Cbc_isProvenInfeasible(model)) {
      status = failed_precondition("milp: the problem is infeasible (no candidate satisfies every constraint)");
    } else if (Cbc_bestSolution(model) == nullptr) {
      status = internal_error("milp: CBC found no solution within " + std::to_string(time_limit_s_) +
                              " s; raise the time limit");
    } else {
      const double* x = Cbc_getColSolution(model);
      out.values.assign(x, x + p.num_columns());
      for (int j = 0; j < p.num_columns(); ++j) {
        if (p.integer[j]) out.values[j] = std::round(out.values[j]);
      }
      out.objective = p.objective_of(out.values);
      out.proven_optimal = Cbc_isProvenOptimal(model) != 0;
    }
    Cbc_deleteModel(model);
    if (!status.ok()) return status;
    return out;
  }

 private:
  double time_limit_s_;
};

}  // namespace

Result<std::unique_ptr<MilpSolver>> make_cbc_solver(double time_limit_s) {
  if (!(time_limit_s > 0)) return invalid_argument("milp: time limit must be > 0 s");
  return std::unique_ptr<MilpSolver>(new CbcSolver(time_limit_s));
}
#else
Result<std::unique_ptr<MilpSolver>> make_cbc_solver(double) {
  return unavailable(
      "milp: Piper was built without COIN-OR CBC; install coinor-libcbc-dev (scripts/setup.sh) and "
      "re-run cmake");
}
#endif

}  // namespace piper::planner

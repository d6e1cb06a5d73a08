// A small mixed-integer linear program and the solver interface the planner uses for it.
//
//   minimise  sum_j cost_j x_j   subject to   sum_j a_ij x_j  (<= | >= | ==)  rhs_i,   lower_j <= x_j <= upper_j,
//   x_j integer for integer columns.
//
// The only backend is COIN-OR CBC through its C API (Debian coinor-libcbc-dev, found with pkg-config `cbc`).
// A build without CBC still compiles: make_cbc_solver() then returns Unavailable with the package to install,
// and the disaggregation allocator falls back to exhaustive enumeration (disaggregate.h), which is also the
// test oracle for the MILP. Solvers are stateless: solve() may run concurrently on different problems.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "piper/base/status.h"

namespace piper::planner {

struct MilpProblem {
  enum class Sense { kLessEqual, kGreaterEqual, kEqual };
  struct Row {
    std::vector<int> cols;
    std::vector<double> coefs;
    Sense sense = Sense::kLessEqual;
    double rhs = 0;
    std::string name;
  };
  std::vector<double> cost, lower, upper;
  std::vector<char> integer;
  std::vector<std::string> names;
  std::vector<Row> rows;

  // Returns the new column's index.
  int add_column(const std::string& name, double cost_per_unit, double lo, double hi, bool is_integer);
  int add_binary(const std::string& name, double cost_per_unit) { return add_column(name, cost_per_unit, 0, 1, true); }
  void add_row(const std::string& name, std::vector<int> cols, std::vector<double> coefs, Sense sense, double rhs);
  int num_columns() const { return static_cast<int>(cost.size()); }
  // Checks shapes and bounds (every row's columns exist, lower <= upper, sizes agree).
  Status validate() const;
  // Objective and the largest constraint or bound violation of a point (to check a solver's answer).
  double objective_of(const std::vector<double>& x) const;
  double max_violation(const std::vector<double>& x) const;
};

struct MilpSolution {
  double objective = 0;
  std::vector<double> values;  // one per column
  bool proven_optimal = false;
};

class MilpSolver {
 public:
  virtual ~MilpSolver() = default;
  virtual const char* name() const = 0;
  // Errors: an invalid problem (InvalidArgument), an infeasible one (FailedPrecondition), or a solver failure.
  virtual Result<MilpSolution> solve(const MilpProblem& problem) const = 0;
};

// True when Piper was built with CBC.
bool have_cbc();
// `time_limit_s` bounds one solve; a solve stopped by the limit is reported as not proven optimal.
Result<std::unique_ptr<MilpSolver>> make_cbc_solver(double time_limit_s = 10);

}  // namespace piper::planner

// piper._core: the C++ side of the Python module (docs/python.md). Thin: every function loads its inputs with the
// loaders the commands use (src/cli/scenario.h, compile_input.h, directive_input.h) and calls the library; results
// come back as the JSON objects of the matching `piper <command> --json`, converted to Python values. A Status
// error becomes a piper.Error subclass (piper/errors.py) carrying the message the CLI prints. The GIL is released
// while the library runs; no call aborts the interpreter on bad input.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "piper/base/files.h"
#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/cli/calibration_file.h"
#include "piper/cli/command_json.h"
#include "piper/cli/compile_input.h"
#include "piper/cli/flags.h"
#include "piper/cli/plan_outcome.h"
#include "piper/cli/plan_report.h"
#include "piper/cli/scenario.h"
#include "piper/compile/compile.h"
#include "piper/cost/estimate.h"
#include "piper/ir/directive.h"
#include "piper/planner/search.h"
#include "piper/report/chrome_trace.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/limits.h"
#include "piper/spec/model_json.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/schedules/schedule.h"
#include "piper/strategy/strategy.h"

namespace py = pybind11;

namespace piper::python {
namespace {

// A failed Status on its way to Python (translated in PYBIND11_MODULE below).
struct StatusError {
  StatusCode code;
  std::string message;
};

void check(const Status& s) {
  if (!s.ok()) throw StatusError{s.code(), elide_long_words(s.message())};
}

template <typename T>
T take(Result<T> r) {
  check(r.status());
  return std::move(r).value();
}

// nlohmann's object -> Python dict/list/str/number: the values json.loads(j.dump()) gives for the CLI's output (a
// non-finite float as None: the dump writes null), built directly (dump + json.loads took a third of a
// piper.estimate call; bench/python/estimate_calls.py). Needs the GIL.
PyObject* new_python_value(const Json& j) {
  switch (j.type()) {
    case Json::value_t::boolean:
      return PyBool_FromLong(j.get<bool>() ? 1 : 0);
    case Json::value_t::number_integer:
      return PyLong_FromLongLong(j.get<int64_t>());
    case Json::value_t::number_unsigned:
      return PyLong_FromUnsignedLongLong(j.get<uint64_t>());
    case Json::value_t::number_float: {
      const double v = j.get<double>();
      if (std::isfinite(v)) return PyFloat_FromDouble(v);
      Py_RETURN_NONE;
    }
    case Json::value_t::string: {
      const std::string& v = j.get_ref<const std::string&>();
      return PyUnicode_FromStringAndSize(v.data(), static_cast<Py_ssize_t>(v.size()));
    }
    case Json::value_t::array: {
      PyObject* list = PyList_New(static_cast<Py_ssize_t>(j.size()));
      Py_ssize_t i = 0;
      for (const Json& v : j) PyList_SET_ITEM(list, i++, new_python_value(v));
      return list;
    }
    case Json::value_t::object: {
      PyObject* dict = PyDict_New();
      for (auto it = j.begin(); it != j.end(); ++it) {
        PyObject* key = PyUnicode_FromStringAndSize(it.key().data(), static_cast<Py_ssize_t>(it.key().size()));
        PyObject* value = new_python_value(it.value());
        PyDict_SetItem(dict, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
      }
      return dict;
    }
    default:
      Py_RETURN_NONE;  // null (binary and discarded values do not occur in results)
  }
}

py::object to_python(const Json& j) { return py::reinterpret_steal<py::object>(new_python_value(j)); }

template <typename T>
T opt_value(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) && !d[key].is_none() ? d[key].cast<T>() : fallback;
}

// A numeric keyword checked as the CLI checks its flag (flags.h): the message names the flag, the value and the range.
template <typename T>
T get_int(const py::dict& d, const char* key, const char* flag, const cli::IntRange& range, T fallback) {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  const std::string error = cli::check_int_text(py::str(d[key]).cast<std::string>(), range);
  if (!error.empty()) throw StatusError{StatusCode::kInvalidArgument, std::string(flag) + ": " + error};
  return d[key].cast<T>();
}

double get_real(const py::dict& d, const char* key, const char* flag, const cli::RealRange& range, double fallback) {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  const std::string error = cli::check_real_text(py::str(d[key]).cast<std::string>(), range);
  if (!error.empty()) throw StatusError{StatusCode::kInvalidArgument, std::string(flag) + ": " + error};
  return d[key].cast<double>();
}

const cli::IntRange kGlobalBatchRange{1, cli::kMaxGlobalBatch, "sequences per step"};
const cli::IntRange kSeqRange{1, cli::kMaxSeqLen, "tokens per sequence"};

// The directive list a Python builder wrote (a JSON list), read by the C++ reader; errors name `label`.
std::vector<ir::Directive> parse_directives(const std::string& json_text, const std::string& label) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw StatusError{StatusCode::kInvalidArgument, label + ": not valid JSON"};
  return take(ir::directives_from_json(j, label));
}

cli::PrecisionOptions precision_options(const py::dict& o) {
  cli::PrecisionOptions p;
  p.precision = opt_value<std::string>(o, "precision", "");
  return p;
}

// ScenarioOptions from the keyword arguments of piper.estimate / piper.simulate (piper/__init__.py names them).
cli::ScenarioOptions scenario_options(const py::dict& o) {
  cli::ScenarioOptions s;
  s.strategy = opt_value<std::string>(o, "strategy", "");
  s.global_batch = get_int<int64_t>(o, "global_batch", "--global-batch", kGlobalBatchRange, 0);
  s.seq_len = get_int<int64_t>(o, "seq", "--seq", kSeqRange, 0);
  s.calibration = opt_value<std::string>(o, "calibration", "");
  s.comm_calibration = opt_value<std::string>(o, "comm_calibration", "");
  s.directives = opt_value<std::string>(o, "directives_file", "");
  s.mesh = opt_value<std::string>(o, "mesh", "");
  s.domain_nodes =
      get_int<int>(o, "domain_nodes", "--domain-nodes", {1, kMaxNodesPerDomain, "nodes per scale-up domain"}, 0);
  s.precision = precision_options(o);
  if (o.contains("directives_json") && !o["directives_json"].is_none()) {
    s.directives_label = opt_value<std::string>(o, "directives_label", "<python>");
    s.directive_list = parse_directives(o["directives_json"].cast<std::string>(), s.directives_label);
    s.has_directive_list = true;
  }
  return s;
}

// `piper estimate --json` (command_json.h).
Json run_estimate(const ModelSpec& model, const ClusterSpec& cluster, const cli::ScenarioOptions& o) {
  cli::Scenario sc = take(cli::make_scenario(model, cluster, o));
  cost::CostModel cm = take(cost::CostModel::create(sc.model, sc.cluster, sc.train, sc.calibration));
  check(cli::check_estimable(sc));
  cost::Estimate e;
  check(cm.estimate(sc.strategy, &e));
  return cli::estimate_json(sc, e);
}

// `piper simulate --json` (without --expert-zipf), writing the Chrome trace when `trace` is given.
Json run_simulate(const ModelSpec& model, const ClusterSpec& cluster, const cli::ScenarioOptions& o,
                  const std::string& trace, bool full) {
  cli::Scenario sc = take(cli::make_scenario(model, cluster, o));
  check(sc.strategy.validate());
  sim::SimOptions options;
  options.full = full;
  options.plan_hash = false;
  options.record_timeline = !trace.empty();
  sim::SimReport r =
      take(sc.from_directives ? sim::simulate_directives(sc.model, sc.cluster, sc.train, sc.input.mesh,
                                                         sc.input.directives, sc.strategy, sc.calibration, options)
                              : sim::simulate(sc.model, sc.cluster, sc.train, sc.strategy, sc.calibration, options));
  if (!trace.empty()) check(report::write_chrome_trace(trace, r.compiled.plan, r.sim));
  return cli::simulate_json(sc, r, trace);
}

cli::CompileCliOptions compile_options(const py::dict& o) {
  cli::CompileCliOptions c;
  c.strategy = opt_value<std::string>(o, "strategy", "");
  c.directives_file = opt_value<std::string>(o, "directives_file", "");
  c.mesh = opt_value<std::string>(o, "mesh", "");
  c.global_batch = get_int<int64_t>(o, "global_batch", "--global-batch", kGlobalBatchRange, 0);
  c.seq_len = get_int<int64_t>(o, "seq", "--seq", kSeqRange, 0);
  c.microbatches = get_int<int>(o, "microbatches", "--microbatches",
                                {1, cli::kMaxMicrobatches,
                                 "microbatches per step; the graph holds every layer per "
                                 "microbatch"},
                                0);
  c.capacity_gib =
      get_real(o, "capacity_gib", "--capacity-gib", {0, cli::kMaxCapacityGib, true, "GiB of device memory"}, 0.0);
  c.target = opt_value<std::string>(o, "target", "megatron");
  c.precision = precision_options(o);
  if (o.contains("directives_json") && !o["directives_json"].is_none()) {
    c.directives_label = opt_value<std::string>(o, "directives_label", "<python>");
    c.directive_list = parse_directives(o["directives_json"].cast<std::string>(), c.directives_label);
    c.has_directive_list = true;
  }
  return c;
}

// `piper compile --json`: the verified plan's statistics (per program template: instructions, peak memory).
Json run_compile(const ModelSpec& model, const cli::CompileCliOptions& o) {
  cli::CompileInputs in = take(cli::resolve_compile_inputs(o, &model));
  compile::CompileOptions options;
  options.capacity_bytes = static_cast<int64_t>(o.capacity_gib * static_cast<double>(1LL << 30));
  options.tp_overlap = in.tp_overlap;
  compile::CompileResult r = take(compile::compile_directives(in.model, in.train, in.mesh, in.directives, options));
  return cli::compile_json(in, r);
}

// The directives a strategy stands for (the list in `piper compile --strategy S --emit-directives F`) and its mesh.
Json strategy_directives_json(const ModelSpec& model, const cli::CompileCliOptions& o) {
  cli::CompileInputs in = take(cli::resolve_compile_inputs(o, &model));
  const ir::MeshInfo& m = in.mesh;
  return Json{{"directives", ir::directives_to_json(in.directives)["directives"]},
              {"mesh", Json{{"pp", m.pp}, {"vpp", m.vpp}, {"dp", m.dp}, {"ep", m.ep}, {"tp", m.tp}}}};
}

// `piper plan --json` over a cluster (not --local-ranks, --disaggregate or --candidate); no plan raises the CLI's
// error (plan_outcome.h).
Json run_plan(const ModelSpec& model, ClusterSpec cluster, const py::dict& o) {
  cli::ScenarioOptions so = scenario_options(o);
  TrainSpec train;
  train.global_batch = so.global_batch;
  train.seq_len = take(cli::resolve_seq_len(model, so.seq_len));
  check(cli::apply_domain_nodes(so.domain_nodes, &cluster));
  check(cli::apply_precision_options(so.precision, &train));
  // The link calibration as `piper plan` finds it (calibration_file.h: the default file on local-cpu only).
  const std::string links_source = take(cli::apply_link_calibration(so.comm_calibration, &cluster));
  planner::SearchOptions options;
  // The ranges of `piper plan`'s flags (cmd_plan.cc).
  options.top_k = get_int<int>(o, "top", "--top", {1, 1000, "plans kept"}, 5);
  options.memory_fraction =
      get_real(o, "memory_fraction", "--memory-fraction", {0, 1, true, "share of device memory"}, 0.95);
  options.verify = opt_value<bool>(o, "verify", true);
  options.verify_attempts_per_plan =
      get_int<int>(o, "verify_attempts", "--verify-attempts", {1, 1000, "compilations per plan returned"}, 3);
  options.threads = get_int<int>(o, "threads", "--threads", {1, cli::kMaxThreads, "search threads"},
                                 static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  options.simulate_top =
      get_int<int>(o, "simulate_top", "--simulate-top", {0, 1000, "plans re-scored by the simulator"}, options.top_k);
  options.local_search_steps = get_int<int>(o, "local_search", "--local-search", {0, 1000, "neighbours simulated"}, 8);
  options.simulate_budget_s =
      get_real(o, "sim_budget_s", "--sim-budget-s", {0, 86400, false, "seconds, at most a day"}, 15.0);
  options.rescore_bound = opt_value<bool>(o, "rescore_bound", true);
  const cli::DeviceCalibration device = take(cli::load_device_calibration(so.calibration, cluster.name));
  options.calibration = device.calibration;
  if (o.contains("schedules") && !o["schedules"].is_none()) {
    options.space.schedules = o["schedules"].cast<std::vector<std::string>>();
  }
  planner::SearchResult r;
  {
    py::gil_scoped_release release;
    r = take(planner::search(model, cluster, train, options));
  }
  if (r.top.empty()) check(cli::nothing_fits(cluster, options.memory_fraction, r));
  Json j = cli::plan_json(model, cluster, train, r);
  j["calibration"] = device.source;
  j["links"] = links_source;
  return j;
}

// Runs `f` (which returns Json) without the GIL and converts its result with it.
template <typename F>
py::object released(F&& f) {
  Json result;
  {
    py::gil_scoped_release release;
    result = f();
  }
  return to_python(result);
}

// A schedule written in Python (piper.register_schedule, piper/schedules.py). `generate(params)` returns the
// directive list as JSON text; it is called under the GIL, from whichever thread compiles (the planner's threads
// hold no GIL). `stages_per_rank` is a constant >= 1, or 0 for "the strategy's vpp". The Python callable is kept
// for the life of the process, as C++ schedules are (the registry outlives the interpreter, so it never releases
// the reference: a release after the interpreter finalised would crash at exit).
void register_python_schedule(const std::string& name, const std::string& help, int stages_per_rank,
                              const py::function& generate) {
  const std::vector<std::string>& built_in = piper::schedule_names();
  if (std::find(built_in.begin(), built_in.end(), name) != built_in.end()) {
    throw StatusError{StatusCode::kInvalidArgument, "register_schedule: '" + name +
                                                        "' is a built-in schedule and cannot be replaced; pick "
                                                        "another name"};
  }
  PyObject* fn = generate.ptr();
  Py_INCREF(fn);
  schedules::ScheduleInfo info;
  info.name = name;
  info.help = help;
  info.stages_per_rank = [stages_per_rank](const schedules::ScheduleParams& p) {
    return stages_per_rank > 0 ? stages_per_rank : p.vpp;
  };
  info.generate = [fn, name](const schedules::ScheduleParams& p) -> Result<std::vector<ir::Directive>> {
    std::string text;
    {
      py::gil_scoped_acquire gil;
      try {
        py::dict params;
        params["pp"] = p.pp;
        params["microbatches"] = p.microbatches;
        params["vpp"] = p.vpp;
        params["ep_overlap"] = p.ep_overlap;
        text = py::reinterpret_borrow<py::function>(fn)(params).cast<std::string>();
      } catch (py::error_already_set& e) {  // "Type: message", without pybind11's traceback lines
        const std::string type = py::str(e.type().attr("__name__"));
        return invalid_argument("the Python function raised " + type + ": " + std::string(py::str(e.value())));
      } catch (const py::cast_error&) {
        return internal_error("the Python wrapper returned no JSON text (piper/schedules.py)");
      }
    }
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return internal_error("the Python wrapper returned invalid JSON (piper/schedules.py)");
    return ir::directives_from_json(j, "schedule " + name + " (Python)");
  };
  schedules::register_schedule(std::move(info));
}

void define_specs(py::module_& m) {
  py::class_<ModelSpec>(m, "ModelSpec")
      .def_property_readonly("name", [](const ModelSpec& s) { return s.name; })
      .def("to_json", [](const ModelSpec& s) { return to_python(to_json(s)); });
  py::class_<ClusterSpec>(m, "ClusterSpec")
      .def_property_readonly("name", [](const ClusterSpec& c) { return c.name; })
      .def_property_readonly("num_nodes", [](const ClusterSpec& c) { return c.num_nodes; })
      .def_property_readonly("world_size", [](const ClusterSpec& c) { return c.world_size(); })
      .def("to_json", [](const ClusterSpec& c) { return to_python(to_json(c)); });
  m.def("load_model", [](const std::string& name_or_path) { return take(load_model(name_or_path)); });
  m.def("model_from_text", [](const std::string& text, const std::string& name, const std::string& what) {
    return take(load_model_from_text(text, name, what));
  });
  m.def("load_cluster", [](const std::string& name_or_path, const py::object& nodes) {
    py::dict d;
    d["nodes"] = nodes;
    const int n = get_int<int>(d, "nodes", "--nodes", {1, cli::kMaxNodes, "nodes of the cluster"}, 1);
    return take(load_cluster(name_or_path, n));
  });
  // (canonical text, every key as JSON): Strategy::parse, whose to_string() parses back to the same strategy.
  m.def("parse_strategy", [](const std::string& text) {
    Strategy s = take(Strategy::parse(text));
    return py::make_tuple(s.to_string(), to_python(s.to_json()));
  });
}

}  // namespace
}  // namespace piper::python

PYBIND11_MODULE(_core, m) {
  using namespace piper;
  using namespace piper::python;
  m.doc() = "Piper's C++ library (use the package piper, not this module)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object cls = py::module_::import("piper.errors").attr("error_class")(status_code_name(e.code));
      PyErr_SetObject(cls.ptr(), py::str(e.message).ptr());
    }
  });
  define_specs(m);
  m.def("estimate", [](const ModelSpec& model, const ClusterSpec& cluster, const py::dict& o) {
    cli::ScenarioOptions so = scenario_options(o);
    return released([&] { return run_estimate(model, cluster, so); });
  });
  m.def("simulate", [](const ModelSpec& model, const ClusterSpec& cluster, const py::dict& o) {
    cli::ScenarioOptions so = scenario_options(o);
    const std::string trace = opt_value<std::string>(o, "trace", "");
    const bool full = opt_value<bool>(o, "full", false);
    return released([&] { return run_simulate(model, cluster, so, trace, full); });
  });
  m.def("compile", [](const ModelSpec& model, const py::dict& o) {
    cli::CompileCliOptions co = compile_options(o);
    return released([&] { return run_compile(model, co); });
  });
  m.def("strategy_directives", [](const ModelSpec& model, const py::dict& o) {
    cli::CompileCliOptions co = compile_options(o);
    return released([&] { return strategy_directives_json(model, co); });
  });
  m.def("plan", [](const ModelSpec& model, const ClusterSpec& cluster, const py::dict& o) {
    return to_python(run_plan(model, cluster, o));
  });
  // `piper plan --report FILE` from a plan's JSON (plan_report.h): the extension check, and the writer.
  m.def("check_plan_report_path", [](const std::string& path) { check(cli::check_plan_report_path(path)); });
  m.def("write_plan_report", [](const std::string& path, const std::string& plan, double memory_fraction) {
    check(cli::write_plan_report(path, Json::parse(plan), memory_fraction));
  });
  m.def("schedule_names", [] { return schedules::schedule_names(); });
  m.def("builtin_schedule_names", [] { return piper::schedule_names(); });
  m.def("register_schedule", &register_python_schedule);
  // A schedule's own directives (place + order), as the compiler asks for them (`piper schedule` prints them).
  m.def("schedule_directives", [](const std::string& name, int pp, int microbatches, int vpp, bool ep_overlap) {
    schedules::ScheduleParams p{pp, microbatches, vpp, ep_overlap};
    std::vector<ir::Directive> d;
    {
      py::gil_scoped_release release;
      d = take(schedules::schedule_directives(name, p));
    }
    return to_python(ir::directives_to_json(d)["directives"]);
  });
  // The C++ reader's view of a directive list: parsed (errors as the CLI names them) and written back (the list of
  // the {"directives": [...]} object `piper compile --emit-directives` writes).
  m.def("read_directives", [](const std::string& json_text, const std::string& label) {
    return to_python(ir::directives_to_json(parse_directives(json_text, label))["directives"]);
  });
}

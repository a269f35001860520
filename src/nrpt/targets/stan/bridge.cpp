// nrpt's bridge to a compiled Stan model (Python extension `_nrpt_stan_bridge`).
//
// This translation unit does not depend on the Stan program: it talks to the model through
// stan::model::model_base and the `new_model` factory that stanc generates.  It is compiled
// once per (this file, httpstan version, compiler, flags) and linked with each model's own
// object file (see nrpt/targets/stan/build.py).  Every member evaluates a batch of states
// [n, d] (float64, C order) in a C++ loop; a Stan exception or a non-finite value at a
// state gives lp = -inf (and a zero gradient) for that row, never a crash.
#include <stan/version.hpp>
#include <stan/model/model_base.hpp>
#include <stan/io/json/json_data.hpp>
#include <stan/io/empty_var_context.hpp>
#include <stan/io/array_var_context.hpp>
#include <stan/callbacks/interrupt.hpp>
#include <stan/callbacks/logger.hpp>
#include <stan/callbacks/writer.hpp>
#include <stan/services/sample/hmc_nuts_diag_e_adapt.hpp>
#include <stan/services/util/create_rng.hpp>
#include <stan/math/rev.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

// defined by the stanc-generated model code (the model's own object file)
stan::model::model_base& new_model(stan::io::var_context& data_context, unsigned int seed,
                                   std::ostream* msg_stream);

namespace py = pybind11;
using array_d = py::array_t<double, py::array::c_style | py::array::forcecast>;

namespace {

const double NEG_INF = -std::numeric_limits<double>::infinity();

// collects what a Stan service writes: column names, rows, messages
class memory_writer : public stan::callbacks::writer {
 public:
  std::vector<std::string> names;
  std::vector<std::vector<double>> rows;
  std::vector<std::string> messages;
  void operator()(const std::vector<std::string>& n) override { names = n; }
  void operator()(const std::vector<double>& state) override { rows.push_back(state); }
  void operator()(const std::string& message) override { messages.push_back(message); }
  void operator()() override {}
};

class memory_logger : public stan::callbacks::logger {
 public:
  std::vector<std::string> messages;
  void debug(const std::string&) override {}
  void debug(const std::stringstream&) override {}
  void info(const std::string& m) override { keep(m); }
  void info(const std::stringstream& m) override { keep(m.str()); }
  void warn(const std::string& m) override { keep(m); }
  void warn(const std::stringstream& m) override { keep(m.str()); }
  void error(const std::string& m) override { keep(m); }
  void error(const std::stringstream& m) override { keep(m.str()); }
  void fatal(const std::string& m) override { keep(m); }
  void fatal(const std::stringstream& m) override { keep(m.str()); }

 private:
  void keep(const std::string& m) {
    if (!m.empty() && messages.size() < 200) messages.push_back(m);
  }
};

class StanModel {
 public:
  StanModel(const std::string& data_json, unsigned int seed) {
    std::stringstream in(data_json);
    std::stringstream msg;
    try {
      stan::json::json_data context(in);
      model_ = &new_model(context, seed, &msg);
    } catch (const std::exception& e) {
      throw std::invalid_argument(std::string(e.what()) + (msg.str().empty() ? "" : "\n" + msg.str()));
    }
    owned_.reset(model_);
    dim_ = model_->num_params_r();
  }

  std::string name() const { return model_->model_name(); }
  size_t dim() const { return dim_; }

  std::vector<std::string> param_names(bool tparams, bool gqs) const {
    std::vector<std::string> out;
    model_->constrained_param_names(out, tparams, gqs);
    return out;
  }
  std::vector<std::string> unconstrained_names() const {
    std::vector<std::string> out;
    model_->unconstrained_param_names(out, false, false);
    return out;
  }
  // (variable names, their dims) in declaration order
  py::tuple variables(bool tparams, bool gqs) const {
    std::vector<std::string> names;
    std::vector<std::vector<size_t>> dims;
    model_->get_param_names(names, tparams, gqs);
    model_->get_dims(dims, tparams, gqs);
    return py::make_tuple(names, dims);
  }

  py::array_t<double> log_density(array_d x, bool jacobian, bool propto) const {
    const size_t n = rows(x);
    py::array_t<double> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
    const double* px = x.data();
    double* po = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      Eigen::VectorXd v(dim_);
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < dim_; ++j) v[j] = px[i * dim_ + j];
        po[i] = propto ? lp_grad(v, jacobian, true, nullptr) : lp_double(v, jacobian);
      }
    }
    return out;
  }

  py::tuple log_density_grad(array_d x, bool jacobian, bool propto) const {
    const size_t n = rows(x);
    py::array_t<double> lp(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
    py::array_t<double> grad({n, dim_});
    const double* px = x.data();
    double* pl = lp.mutable_data();
    double* pg = grad.mutable_data();
    {
      py::gil_scoped_release nogil;
      Eigen::VectorXd v(dim_);
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < dim_; ++j) v[j] = px[i * dim_ + j];
        pl[i] = lp_grad(v, jacobian, propto, pg + i * dim_);
      }
    }
    return py::make_tuple(lp, grad);
  }

  // constrained values (parameters, optionally transformed parameters and generated
  // quantities) per state, [n, k]; a state where Stan throws gives a row of NaN
  py::array_t<double> write_array(array_d x, bool tparams, bool gqs, unsigned int seed) const {
    const size_t n = rows(x);
    const size_t k = param_names(tparams, gqs).size();
    py::array_t<double> out({n, k});
    const double* px = x.data();
    double* po = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      stan::rng_t rng = stan::services::util::create_rng(seed, 0);
      Eigen::VectorXd v(dim_), vars(k);
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < dim_; ++j) v[j] = px[i * dim_ + j];
        bool ok = true;
        try {
          model_->write_array(rng, v, vars, tparams, gqs, nullptr);
        } catch (const std::exception&) {
          ok = false;
        }
        for (size_t j = 0; j < k; ++j)
          po[i * k + j] = ok && j < static_cast<size_t>(vars.size())
                              ? vars[j] : std::numeric_limits<double>::quiet_NaN();
      }
    }
    return out;
  }

  // constrained parameter values (the layout of param_names(false, false)) -> unconstrained
  py::array_t<double> unconstrain(array_d c) const {
    const size_t k = param_names(false, false).size();
    if (c.ndim() != 2 || static_cast<size_t>(c.shape(1)) != k)
      throw std::invalid_argument("unconstrain expects constrained values of shape [n, "
                                  + std::to_string(k) + "]");
    const size_t n = c.shape(0);
    py::array_t<double> out({n, dim_});
    const double* pc = c.data();
    double* po = out.mutable_data();
    Eigen::VectorXd in(k), u(dim_);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < k; ++j) in[j] = pc[i * k + j];
      try {
        model_->unconstrain_array(in, u, nullptr);
      } catch (const std::exception& e) {
        throw std::invalid_argument("Stan refused the constrained values of row "
                                    + std::to_string(i) + ": " + e.what());
      }
      for (size_t j = 0; j < dim_; ++j) po[i * dim_ + j] = u[j];
    }
    return out;
  }

  // Stan's own NUTS (diagonal metric, adapted): chains run one after another from Stan's
  // default random inits (uniform(-2, 2) unconstrained) with chain ids 1..chains.
  py::dict nuts(int chains, int warmup, int draws, unsigned int seed, int max_depth,
                double delta, int thin) const {
    py::list out_draws, out_messages, out_times;
    std::vector<std::string> names;
    for (int c = 0; c < chains; ++c) {
      memory_writer init_w, sample_w, diag_w;
      memory_logger logger;
      stan::callbacks::interrupt interrupt;
      stan::io::empty_var_context init;
      int rc;
      double seconds;
      {
        py::gil_scoped_release nogil;
        auto t0 = std::chrono::steady_clock::now();
        rc = stan::services::sample::hmc_nuts_diag_e_adapt(
            *model_, init, seed, static_cast<unsigned int>(c + 1), 2.0, warmup, draws, thin,
            false, 0, 1.0, 0.0, max_depth, delta, 0.05, 0.75, 10.0, 75, 50, 25, interrupt,
            logger, init_w, sample_w, diag_w);
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      if (rc != 0) {
        std::string msg;
        for (auto& m : logger.messages) msg += m + "\n";
        throw std::runtime_error("Stan's NUTS failed (chain " + std::to_string(c + 1)
                                 + ", return code " + std::to_string(rc) + "):\n" + msg);
      }
      names = sample_w.names;
      const size_t rows_n = sample_w.rows.size(), cols = names.size();
      py::array_t<double> a({rows_n, cols});
      double* pa = a.mutable_data();
      for (size_t i = 0; i < rows_n; ++i)
        for (size_t j = 0; j < cols; ++j)
          pa[i * cols + j] = j < sample_w.rows[i].size() ? sample_w.rows[i][j]
                                                         : std::numeric_limits<double>::quiet_NaN();
      out_draws.append(a);
      py::list msgs;
      for (auto& m : sample_w.messages) msgs.append(m);
      for (auto& m : logger.messages) msgs.append(m);
      out_messages.append(msgs);
      out_times.append(seconds);
    }
    py::dict d;
    d["names"] = names;
    d["draws"] = out_draws;
    d["messages"] = out_messages;
    d["seconds"] = out_times;
    return d;
  }

 private:
  stan::model::model_base* model_ = nullptr;
  std::unique_ptr<stan::model::model_base> owned_;
  size_t dim_ = 0;

  size_t rows(const array_d& x) const {
    if (x.ndim() != 2 || static_cast<size_t>(x.shape(1)) != dim_)
      throw std::invalid_argument("expected states of shape [n, " + std::to_string(dim_)
                                  + "]");
    return x.shape(0);
  }

  double lp_double(Eigen::VectorXd& v, bool jacobian) const {
    try {
      double lp = jacobian ? model_->log_prob_jacobian(v, nullptr) : model_->log_prob(v, nullptr);
      return std::isfinite(lp) ? lp : NEG_INF;
    } catch (const std::exception&) {
      return NEG_INF;
    }
  }

  // log density and (when g is given) its gradient, by reverse mode
  double lp_grad(const Eigen::VectorXd& v, bool jacobian, bool propto, double* g) const {
    using stan::math::var;
    double lp;
    bool ok = true;
    try {
      Eigen::Matrix<var, -1, 1> xv(v.size());
      for (Eigen::Index j = 0; j < v.size(); ++j) xv[j] = v[j];
      var r;
      if (propto)
        r = jacobian ? model_->log_prob_propto_jacobian(xv, nullptr)
                     : model_->log_prob_propto(xv, nullptr);
      else
        r = jacobian ? model_->log_prob_jacobian(xv, nullptr) : model_->log_prob(xv, nullptr);
      lp = r.val();
      if (g != nullptr && std::isfinite(lp)) {
        r.grad();
        for (Eigen::Index j = 0; j < v.size(); ++j) {
          g[j] = xv[j].adj();
          if (!std::isfinite(g[j])) ok = false;
        }
      }
    } catch (const std::exception&) {
      ok = false;
      lp = NEG_INF;
    }
    stan::math::recover_memory();
    if (!std::isfinite(lp) || !ok) {
      lp = NEG_INF;
      if (g != nullptr)
        for (size_t j = 0; j < dim_; ++j) g[j] = 0.0;
    }
    return lp;
  }
};

}  // namespace

PYBIND11_MODULE(_nrpt_stan_bridge, m) {
  m.doc() = "nrpt's bridge to one compiled Stan model";
  m.attr("stan_version") = std::to_string(STAN_MAJOR) + "." + std::to_string(STAN_MINOR)
                           + "." + std::to_string(STAN_PATCH);
  py::class_<StanModel>(m, "StanModel", py::module_local())
      .def(py::init<const std::string&, unsigned int>(), py::arg("data_json"), py::arg("seed") = 0)
      .def_property_readonly("name", &StanModel::name)
      .def_property_readonly("dim", &StanModel::dim)
      .def("param_names", &StanModel::param_names, py::arg("tparams") = false,
           py::arg("gqs") = false)
      .def("unconstrained_names", &StanModel::unconstrained_names)
      .def("variables", &StanModel::variables, py::arg("tparams") = false, py::arg("gqs") = false)
      .def("log_density", &StanModel::log_density, py::arg("x"), py::arg("jacobian") = true,
           py::arg("propto") = false)
      .def("log_density_grad", &StanModel::log_density_grad, py::arg("x"),
           py::arg("jacobian") = true, py::arg("propto") = false)
      .def("write_array", &StanModel::write_array, py::arg("x"), py::arg("tparams") = true,
           py::arg("gqs") = false, py::arg("seed") = 0)
      .def("unconstrain", &StanModel::unconstrain, py::arg("c"))
      .def("nuts", &StanModel::nuts, py::arg("chains") = 4, py::arg("warmup") = 1000,
           py::arg("draws") = 1000, py::arg("seed") = 1, py::arg("max_depth") = 10,
           py::arg("delta") = 0.8, py::arg("thin") = 1);
}

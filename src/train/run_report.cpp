#include "train/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"

namespace ft::train {
namespace {

constexpr size_t kStepsShownPerFailure = 3;
// A step whose baseline gradient norm is this many times the run's median is called a spike.
constexpr double kSpikeRatio = 10.0;
// A declared total this far past the logged steps is a typo, not steps to expect.
constexpr int64_t kMaxExpectedSteps = 1'000'000;

template <class... Args>
std::string printf_str(const char* fmt, Args... args) {
  char buf[128];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

std::string or_dash(const std::optional<double>& v, const char* fmt) {
  return v ? printf_str(fmt, *v) : std::string("-");
}

// "3, 7-9": a sorted step list with runs collapsed.
std::string step_ranges(const std::vector<int64_t>& steps) {
  std::string out;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(steps[i]);
    if (j > i) out += str('-', steps[j]);
    i = j + 1;
  }
  return out;
}

std::string markdown_cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string csv_number(const std::optional<double>& v) {
  return v ? printf_str("%.10g", *v) : std::string();
}

// The problems that keep a case from being compared at all: a side missing or unreadable, or
// the two sides disagreeing on the dtype. Returns the case's dtype ("?" when unknown).
std::string check_pair(const CasePair& pair, std::vector<std::string>& problems, bool& bad_input) {
  const RunLog* sides[2] = {pair.base, pair.test};
  const char* names[2] = {"base", "test"};
  for (int i = 0; i < 2; ++i) {
    const RunLog* other = sides[1 - i];
    if (sides[i] == nullptr) {
      problems.push_back(str("only in ", names[1 - i], " (", other->path, "); no ", names[i],
                             " log of this name"));
    } else if (!sides[i]->ok()) {
      problems.push_back(str(names[i], " log unreadable: ", sides[i]->error));
      bad_input = true;
    }
  }
  const std::string base_dtype = pair.base ? pair.base->dtype : "";
  const std::string test_dtype = pair.test ? pair.test->dtype : "";
  if (!base_dtype.empty() && !test_dtype.empty() && base_dtype != test_dtype) {
    problems.push_back(str("dtypes differ: base ", base_dtype, ", test ", test_dtype));
  }
  if (!base_dtype.empty()) return base_dtype;
  return test_dtype.empty() ? "?" : test_dtype;
}

std::string describe(const RunFailure& f) {
  return str("in step ", f.step, ": ", f.message);
}

// How the runs ended. A test run that stopped, or a baseline that stopped other than out of
// memory, is a problem of the case; a baseline out of memory is returned (described), since
// a baseline that does not fit is a result of its own.
std::string check_failures(const CasePair& pair, std::vector<std::string>& problems) {
  std::string base_out_of_memory;
  if (pair.base && pair.base->ok() && pair.base->failure) {
    const RunFailure& f = *pair.base->failure;
    if (f.out_of_memory()) {
      base_out_of_memory = describe(f);
    } else {
      problems.push_back(str("the base run stopped ", describe(f)));
    }
  }
  if (pair.test && pair.test->ok() && pair.test->failure) {
    problems.push_back(str("the test run stopped ", describe(*pair.test->failure)));
  }
  return base_out_of_memory;
}

std::map<int64_t, double> losses_by_step(const RunLog& log) {
  std::map<int64_t, double> m;
  for (const LoggedStep& s : log.steps) m[s.step] = s.train_loss;
  return m;
}

// Every step either side logged, plus the declared range from the first step logged.
std::set<int64_t> expected_steps(const RunLog& base, const RunLog& test) {
  std::set<int64_t> steps;
  int64_t declared = 0;
  for (const RunLog* log : {&base, &test}) {
    for (const LoggedStep& s : log->steps) {
      steps.insert(s.step);
      declared = std::max(declared, s.total_steps);
    }
  }
  if (steps.empty()) return steps;  // both runs stopped before their first step
  const int64_t first = *steps.begin();
  if (declared - first < kMaxExpectedSteps) {
    for (int64_t s = first; s <= declared; ++s) steps.insert(s);
  }
  return steps;
}

std::optional<double> mean(const std::vector<double>& v) {
  if (v.empty()) return std::nullopt;
  double sum = 0.0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

std::optional<double> maximum(const std::vector<double>& v) {
  if (v.empty()) return std::nullopt;
  return *std::max_element(v.begin(), v.end());
}

std::optional<double> ratio(const std::optional<double>& num, const std::optional<double>& den) {
  if (!num || !den || *den <= 0.0) return std::nullopt;
  return *num / *den;
}

std::optional<double> saved(const std::optional<double>& base, const std::optional<double>& test) {
  if (!base || !test || *base <= 0.0) return std::nullopt;
  return (*base - *test) / *base;
}

}  // namespace

std::vector<CasePair> pair_runs(const std::vector<RunLog>& base, const std::vector<RunLog>& test,
                                bool two_files) {
  if (two_files && base.size() == 1 && test.size() == 1) {
    return {CasePair{base[0].name, &base[0], &test[0]}};
  }
  std::map<std::string, CasePair> by_name;
  for (const RunLog& r : base) {
    by_name[r.name].name = r.name;
    by_name[r.name].base = &r;
  }
  for (const RunLog& r : test) {
    by_name[r.name].name = r.name;
    by_name[r.name].test = &r;
  }
  std::vector<CasePair> pairs;
  for (auto& [name, p] : by_name) pairs.push_back(p);
  return pairs;
}

// ---- loss alignment ----

LossComparison compare_losses(const CasePair& pair, const LossThresholds& thresholds) {
  LossComparison c;
  c.name = pair.name;
  c.dtype = check_pair(pair, c.problems, c.bad_input);
  c.threshold = thresholds.for_dtype(c.dtype);
  if (!pair.base || !pair.test || !pair.base->ok() || !pair.test->ok()) return c;
  c.base_out_of_memory = check_failures(pair, c.problems);
  // A baseline out of memory in step F is expected to have logged the steps before F only.
  const int64_t base_end =
      c.base_out_of_memory.empty() ? std::numeric_limits<int64_t>::max() : pair.base->failure->step;

  const std::map<int64_t, double> base = losses_by_step(*pair.base);
  const std::map<int64_t, double> test = losses_by_step(*pair.test);
  std::map<int64_t, double> base_grad_norms;
  for (const LoggedStep& s : pair.base->steps) {
    if (s.grad_norm && std::isfinite(*s.grad_norm)) base_grad_norms[s.step] = *s.grad_norm;
  }
  for (int64_t step : expected_steps(*pair.base, *pair.test)) {
    const auto b = base.find(step);
    const auto t = test.find(step);
    if (b == base.end() && step < base_end) c.missing_in_base.push_back(step);
    if (t == test.end()) c.missing_in_test.push_back(step);
    if (b == base.end() || t == test.end()) continue;
    ++c.steps_compared;
    const bool finite = std::isfinite(b->second) && std::isfinite(t->second);
    const double diff =
        finite ? std::fabs(b->second - t->second) : std::numeric_limits<double>::infinity();
    if (c.max_diff_step == 0 || diff > c.max_abs_diff) {
      c.max_abs_diff = diff;
      c.max_diff_step = step;
    }
    if (!finite || diff > c.threshold) {
      ++c.steps_over;
      if (c.first_over.size() < kStepsShownPerFailure) {
        c.first_over.push_back({step, b->second, t->second, diff, std::nullopt, std::nullopt});
      }
    }
  }
  // Gradient-norm context for the steps over the threshold: the norm, and its ratio to the
  // median over the steps both sides logged.
  std::vector<double> norms;
  for (const auto& [step, loss] : test) {
    const auto g = base_grad_norms.find(step);
    if (g != base_grad_norms.end()) norms.push_back(g->second);
  }
  if (!norms.empty()) {
    std::nth_element(norms.begin(), norms.begin() + norms.size() / 2, norms.end());
    const double median = norms[norms.size() / 2];
    for (StepDifference& d : c.first_over) {
      const auto g = base_grad_norms.find(d.step);
      if (g == base_grad_norms.end()) continue;
      d.base_grad_norm = g->second;
      if (median > 0.0) d.grad_norm_ratio = g->second / median;
    }
  }
  return c;
}

std::vector<LossComparison> compare_all_losses(const std::vector<CasePair>& pairs,
                                               const LossThresholds& thresholds) {
  std::vector<LossComparison> out;
  for (const CasePair& p : pairs) out.push_back(compare_losses(p, thresholds));
  return out;
}

int loss_exit_code(const std::vector<LossComparison>& cases) {
  int code = report_ok;
  for (const LossComparison& c : cases) {
    if (c.bad_input) return report_bad_input;
    if (!c.passed() && !c.baseline_did_not_fit()) code = report_case_failed;
  }
  return code;
}

std::string render_loss_report(const std::vector<LossComparison>& cases,
                               const LossThresholds& thresholds) {
  std::ostringstream os;
  os << "| case | dtype | threshold | steps compared | max abs diff | at step | first step over "
        "| result |\n"
     << "|---|---|---:|---:|---:|---:|---:|---|\n";
  for (const LossComparison& c : cases) {
    const bool compared = c.steps_compared > 0;
    const std::optional<int64_t> over = c.first_step_over();
    os << "| " << markdown_cell(c.name) << " | " << c.dtype << " | "
       << printf_str("%.0e", c.threshold) << " | " << c.steps_compared << " | "
       << (compared ? printf_str("%.2e", c.max_abs_diff) : std::string("-")) << " | "
       << (compared ? std::to_string(c.max_diff_step) : std::string("-")) << " | "
       << (over ? std::to_string(*over) : std::string("-")) << " | "
       << (c.passed()                 ? "pass"
           : c.baseline_did_not_fit() ? "base OOM"
                                      : "FAIL")
       << " |\n";
  }

  std::ostringstream did_not_fit;
  for (const LossComparison& c : cases) {
    if (c.baseline_did_not_fit()) {
      did_not_fit << "- " << c.name << ": " << c.base_out_of_memory << "\n";
    }
  }
  if (!did_not_fit.str().empty()) {
    os << "\nNot compared, the baseline ran out of memory (the test run is complete):\n"
       << did_not_fit.str();
  }

  std::ostringstream failures;
  for (const LossComparison& c : cases) {
    for (const std::string& p : c.problems) failures << "- " << c.name << ": " << p << "\n";
    if (!c.missing_in_base.empty()) {
      failures << "- " << c.name << ": steps missing in base: " << step_ranges(c.missing_in_base)
               << "\n";
    }
    if (!c.missing_in_test.empty()) {
      failures << "- " << c.name << ": steps missing in test: " << step_ranges(c.missing_in_test)
               << "\n";
    }
    if (c.steps_over > 0) {
      failures << "- " << c.name << ": " << c.steps_over << " of " << c.steps_compared
               << " steps over " << printf_str("%.0e", c.threshold);
      for (const StepDifference& d : c.first_over) {
        failures << "; step " << d.step << ": base " << printf_str("%.6f", d.base_loss)
                 << " vs test " << printf_str("%.6f", d.test_loss) << " (diff "
                 << printf_str("%.2e", d.abs_diff);
        if (d.base_grad_norm) {
          failures << ", baseline gradient norm " << printf_str("%.3g", *d.base_grad_norm);
          if (d.grad_norm_ratio) {
            failures << " = " << printf_str("%.3g", *d.grad_norm_ratio) << "x the median"
                     << (*d.grad_norm_ratio >= kSpikeRatio ? ": a gradient spike" : "");
          }
        }
        failures << ")";
      }
      failures << (c.steps_over > static_cast<int64_t>(c.first_over.size()) ? "; ...\n" : "\n");
    }
    if (!c.base_out_of_memory.empty() && !c.baseline_did_not_fit()) {
      failures << "- " << c.name << ": the base run ran out of memory " << c.base_out_of_memory
               << "\n";
    }
    if (c.problems.empty() && c.steps_compared == 0 && c.base_out_of_memory.empty()) {
      failures << "- " << c.name << ": no step logged on both sides\n";
    }
  }
  if (!failures.str().empty()) os << "\nFailures:\n" << failures.str();

  struct Count {
    int passed = 0, did_not_fit = 0, total = 0;
  };
  std::map<std::string, Count> per_dtype;
  Count all;
  for (const LossComparison& c : cases) {
    for (Count* n : {&per_dtype[c.dtype], &all}) {
      n->total += 1;
      n->passed += c.passed() ? 1 : 0;
      n->did_not_fit += c.baseline_did_not_fit() ? 1 : 0;
    }
  }
  auto counts = [](const Count& n) {
    std::string out = str(n.passed, "/", n.total, " cases passed");
    if (n.did_not_fit > 0) out += str(", ", n.did_not_fit, " not compared (base out of memory)");
    return out;
  };
  os << "\nSummary:\n";
  for (const char* dtype : {"fp32", "bf16", "?"}) {
    const auto it = per_dtype.find(dtype);
    if (it == per_dtype.end()) continue;
    const std::string label = it->first == "?" ? "dtype unknown" : it->first;
    os << "  " << label << ": " << counts(it->second);
    if (it->first != "?")
      os << " (threshold " << printf_str("%.0e", thresholds.for_dtype(dtype)) << ")";
    os << "\n";
  }
  os << "  total: " << counts(all) << "\n";
  return os.str();
}

std::string render_loss_steps(const std::vector<CasePair>& pairs) {
  std::ostringstream os;
  for (const CasePair& p : pairs) {
    if (!p.base || !p.test || !p.base->ok() || !p.test->ok()) continue;
    const std::map<int64_t, double> test = losses_by_step(*p.test);
    os << "\n"
       << p.name << ":\n| step | base loss | test loss | abs diff |\n|---:|---:|---:|---:|\n";
    for (const LoggedStep& s : p.base->steps) {
      const auto t = test.find(s.step);
      if (t == test.end()) continue;
      os << "| " << s.step << " | " << printf_str("%.6f", s.train_loss) << " | "
         << printf_str("%.6f", t->second) << " | "
         << printf_str("%.2e", std::fabs(s.train_loss - t->second)) << " |\n";
    }
  }
  return os.str();
}

// ---- performance ----

PerfStats perf_stats(const RunLog& log, bool include_first) {
  PerfStats p;
  std::vector<double> ms, tps, used, reserved, attention;
  for (size_t i = include_first ? 0 : 1; i < log.steps.size(); ++i) {
    const LoggedStep& s = log.steps[i];
    if (p.steps == 0) p.first_step = s.step;
    p.last_step = s.step;
    ++p.steps;
    if (s.ms) ms.push_back(*s.ms);
    if (s.tokens_per_second) tps.push_back(*s.tokens_per_second);
    if (s.peak_used_mb) used.push_back(*s.peak_used_mb);
    if (s.peak_reserved_mb) reserved.push_back(*s.peak_reserved_mb);
    if (s.attention_saved_mb) attention.push_back(*s.attention_saved_mb);
  }
  p.ms = mean(ms);
  p.tokens_per_second = mean(tps);
  p.peak_used_mb = maximum(used);
  p.peak_reserved_mb = maximum(reserved);
  p.attention_saved_mb = maximum(attention);
  return p;
}

std::optional<double> PerfRow::speedup() const {
  if (!base_out_of_memory.empty()) return std::nullopt;
  return ratio(base.ms, test.ms);
}

std::optional<double> PerfRow::tokens_per_second_gain() const {
  const std::optional<double> r = ratio(test.tokens_per_second, base.tokens_per_second);
  if (!r || !base_out_of_memory.empty()) return std::nullopt;
  return *r - 1.0;
}

std::optional<double> PerfRow::peak_used_saved() const {
  if (!base_out_of_memory.empty()) return std::nullopt;
  return saved(base.peak_used_mb, test.peak_used_mb);
}

std::optional<double> PerfRow::peak_reserved_saved() const {
  if (!base_out_of_memory.empty()) return std::nullopt;
  return saved(base.peak_reserved_mb, test.peak_reserved_mb);
}

std::optional<double> PerfRow::peak_used_saved_mb() const {
  if (!base_out_of_memory.empty() || !base.peak_used_mb || !test.peak_used_mb) return std::nullopt;
  return *base.peak_used_mb - *test.peak_used_mb;
}

std::optional<double> PerfRow::expected_saved_mb() const {
  if (!base_out_of_memory.empty() || !base.attention_saved_mb || !test.attention_saved_mb) {
    return std::nullopt;
  }
  return *base.attention_saved_mb - *test.attention_saved_mb;
}

std::vector<PerfRow> summarize_runs(const std::vector<CasePair>& pairs, bool include_first) {
  std::vector<PerfRow> rows;
  for (const CasePair& pair : pairs) {
    PerfRow row;
    row.name = pair.name;
    row.dtype = check_pair(pair, row.problems, row.bad_input);
    if (row.problems.empty()) row.base_out_of_memory = check_failures(pair, row.problems);
    if (row.problems.empty()) {
      row.base = perf_stats(*pair.base, include_first);
      row.test = perf_stats(*pair.test, include_first);
      const std::pair<const char*, const PerfStats*> sides[] = {{"base", &row.base},
                                                                {"test", &row.test}};
      for (const auto& [side, stats] : sides) {
        if (stats->steps > 0 || (stats == &row.base && !row.base_out_of_memory.empty())) continue;
        row.problems.push_back(
            str(side, " has no step to average",
                include_first ? "" : " once step 1 is left out (--include-step1)"));
      }
    }
    rows.push_back(row);
  }
  return rows;
}

int perf_exit_code(const std::vector<PerfRow>& rows) {
  int code = report_ok;
  for (const PerfRow& r : rows) {
    if (r.bad_input) return report_bad_input;
    if (!r.summarized()) code = report_case_failed;
  }
  return code;
}

std::string render_perf_markdown(const std::vector<PerfRow>& rows, const PerfLabels& labels,
                                 bool include_first) {
  const std::string& b = labels.base;
  const std::string& t = labels.test;
  std::ostringstream os;
  os << "Averages over each run's steps"
     << (include_first ? " including step 1" : " after step 1 (step 1 carries the warm-up)")
     << "; peaks are maxima over the same steps. speedup = " << b << " ms / " << t
     << " ms; tok/s gain = " << t << " / " << b << " - 1; saved = (" << b << " - " << t << ") / "
     << b << "; expected = what the attention keeps for backward, " << b << " - " << t
     << " (where the logs say).\n\n";
  os << "| case | dtype | steps | avg ms (" << b << ") | avg ms (" << t << ") | speedup | tok/s ("
     << b << ") | tok/s (" << t << ") | tok/s gain | peak used MB (" << b << ") | peak used MB ("
     << t << ") | used saved | used saved MB (expected) | peak reserved MB (" << b
     << ") | peak reserved MB (" << t << ") | reserved saved |\n"
     << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  std::ostringstream skipped, did_not_fit;
  for (const PerfRow& r : rows) {
    if (!r.summarized()) {
      for (const std::string& p : r.problems) skipped << "- " << r.name << ": " << p << "\n";
      continue;
    }
    const bool oom = !r.base_out_of_memory.empty();
    if (oom) did_not_fit << "- " << r.name << ": " << r.base_out_of_memory << "\n";
    auto base_cell = [&](const std::optional<double>& v, const char* fmt) {
      return oom ? std::string("OOM") : or_dash(v, fmt);
    };
    auto percent = [](const std::optional<double>& v) {
      return v ? printf_str("%+.1f%%", 100.0 * *v) : std::string("-");
    };
    const std::string steps = oom || r.base.steps == r.test.steps
                                  ? std::to_string(r.test.steps)
                                  : str(r.base.steps, " / ", r.test.steps);
    std::string saved_mb = or_dash(r.peak_used_saved_mb(), "%.0f");
    if (r.expected_saved_mb()) saved_mb += printf_str(" (%.0f)", *r.expected_saved_mb());
    os << "| " << markdown_cell(r.name) << " | " << r.dtype << " | " << steps << " | "
       << base_cell(r.base.ms, "%.2f") << " | " << or_dash(r.test.ms, "%.2f") << " | "
       << or_dash(r.speedup(), "%.2fx") << " | " << base_cell(r.base.tokens_per_second, "%.0f")
       << " | " << or_dash(r.test.tokens_per_second, "%.0f") << " | "
       << percent(r.tokens_per_second_gain()) << " | " << base_cell(r.base.peak_used_mb, "%.0f")
       << " | " << or_dash(r.test.peak_used_mb, "%.0f") << " | " << percent(r.peak_used_saved())
       << " | " << saved_mb << " | " << base_cell(r.base.peak_reserved_mb, "%.0f") << " | "
       << or_dash(r.test.peak_reserved_mb, "%.0f") << " | " << percent(r.peak_reserved_saved())
       << " |\n";
  }
  if (!did_not_fit.str().empty()) {
    os << "\nOOM: the " << b << " ran out of memory; the row shows the " << t << " run only:\n"
       << did_not_fit.str();
  }
  if (!skipped.str().empty()) os << "\nNot summarized:\n" << skipped.str();
  return os.str();
}

std::string render_perf_csv(const std::vector<PerfRow>& rows) {
  std::ostringstream os;
  os << "case,dtype,steps_base,steps_test,ms_base,ms_test,speedup,tok_per_s_base,tok_per_s_test,"
        "tok_per_s_gain,peak_used_mb_base,peak_used_mb_test,peak_used_saved,"
        "peak_reserved_mb_base,peak_reserved_mb_test,peak_reserved_saved,peak_used_saved_mb,"
        "attention_saved_mb_base,attention_saved_mb_test,expected_saved_mb,base_out_of_memory,"
        "problem\n";
  for (const PerfRow& r : rows) {
    std::string problem;
    for (const std::string& p : r.problems) problem += (problem.empty() ? "" : "; ") + p;
    const bool ok = r.summarized();
    const bool base_ok = ok && r.base_out_of_memory.empty();
    auto num = [&](const std::optional<double>& v) { return ok ? csv_number(v) : std::string(); };
    auto base = [&](const std::optional<double>& v) {
      return base_ok ? csv_number(v) : std::string();
    };
    os << csv_cell(r.name) << "," << r.dtype << ","
       << (base_ok ? std::to_string(r.base.steps) : std::string()) << ","
       << (ok ? std::to_string(r.test.steps) : std::string()) << "," << base(r.base.ms) << ","
       << num(r.test.ms) << "," << num(r.speedup()) << "," << base(r.base.tokens_per_second) << ","
       << num(r.test.tokens_per_second) << "," << num(r.tokens_per_second_gain()) << ","
       << base(r.base.peak_used_mb) << "," << num(r.test.peak_used_mb) << ","
       << num(r.peak_used_saved()) << "," << base(r.base.peak_reserved_mb) << ","
       << num(r.test.peak_reserved_mb) << "," << num(r.peak_reserved_saved()) << ","
       << num(r.peak_used_saved_mb()) << "," << base(r.base.attention_saved_mb) << ","
       << num(r.test.attention_saved_mb) << "," << num(r.expected_saved_mb()) << ","
       << csv_cell(r.base_out_of_memory) << "," << csv_cell(problem) << "\n";
  }
  return os.str();
}

RunSides load_run_sides(const std::string& base_path, const std::string& test_path) {
  RunSides sides;
  sides.base = load_runs(base_path);
  sides.test = load_runs(test_path);
  sides.two_files =
      !std::filesystem::is_directory(base_path) && !std::filesystem::is_directory(test_path);
  return sides;
}

std::vector<std::string> RunSides::log_errors() const {
  std::vector<std::string> out;
  for (const auto* side : {&base, &test}) {
    for (const RunLog& log : *side) {
      if (!log.ok()) out.push_back(log.error);
    }
  }
  return out;
}

}  // namespace ft::train

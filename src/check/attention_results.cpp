#include "check/attention_results.h"

#include "reference/array_index.h"
#include "reference/reference.h"

namespace flash4::check {

ForwardResult reference_forward(const detail::Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                                const std::vector<double>& v, const std::vector<int64_t>& rows) {
  ForwardResult res;
  const reference::ArrayIndex at{p};
  res.out.assign(static_cast<size_t>(at.q_rows() * p.heads * p.head_dim_v), 0.0);  // out has v's head dim
  res.lse.assign(static_cast<size_t>(at.lse_size()), 0.0);
  reference::forward(p, q.data(), k.data(), v.data(), res.out.data(), res.lse.data(), rows);
  return res;
}

Gradients reference_backward(const detail::Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& dout) {
  Gradients g;
  g.dq.resize(q.size());
  g.dk.resize(k.size());
  g.dv.resize(v.size());
  if (p.learnable_sink) g.dsink.resize(static_cast<size_t>(p.heads));
  reference::backward(p, q.data(), k.data(), v.data(), dout.data(), g.dq.data(), g.dk.data(), g.dv.data(),
                      p.learnable_sink ? g.dsink.data() : nullptr);
  return g;
}

}  // namespace flash4::check

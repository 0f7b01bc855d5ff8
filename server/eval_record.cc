#include "server/eval_record.h"

#include "common/log.h"

namespace dp {

void EvalRecord::Record(const EvalReport& r) {
  last_ = r;
  has_ = true;
  if (r.final) final_ = true;
  if (r.num_samples == 0) {
    Log("rank 0 has no test set: no test accuracy (weights of step %d)",
        r.step);
    return;
  }
  Log("%s test accuracy %.4f, loss %.4f (%d images, weights of step %d, "
      "epoch %d)",
      r.final ? "final" : "epoch", r.accuracy, r.loss, r.num_samples, r.step,
      r.epoch);
}

}  // namespace dp

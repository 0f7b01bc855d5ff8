// The evaluations rank 0 reports to dp-ps: the last one (for GetStatus, the
// metrics and the end line), whether the final one came, and their log
// lines. A plain class: StepCoordinator calls it under its mutex.
#ifndef DP_SERVER_EVAL_RECORD_H_
#define DP_SERVER_EVAL_RECORD_H_

#include "common/job_config.h"

namespace dp {

class EvalRecord {
 public:
  // Keeps `report` as the last, and logs it (a report of no samples: rank
  // 0 has no test set, and the end came unmeasured).
  void Record(const EvalReport& report);

  bool has() const { return has_; }
  bool final_came() const { return final_; }
  const EvalReport& last() const { return last_; }

 private:
  bool has_ = false;
  bool final_ = false;
  EvalReport last_;
};

}  // namespace dp

#endif  // DP_SERVER_EVAL_RECORD_H_

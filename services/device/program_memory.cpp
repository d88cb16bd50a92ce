#include "services/device/program_memory.h"

#include <map>
#include <string>
#include <utility>

#include "core/base/error.h"
#include "core/ipc/model_access.h"
#include "core/model/gguf.h"
#include "shm/completion_flag.h"
#include "shm/flag_sync.h"
#include "shm/segment.h"

namespace duet {

struct ShmMemoryResolver::Mappings {
  std::map<std::string, std::shared_ptr<shm::Segment>> segments;
  std::map<std::string, std::shared_ptr<shm::FlagTable>> flag_tables;
  std::map<std::string, std::shared_ptr<GgufFile>> models;

  // The segment a name refers to NOW: a restarted frontend removes its segments and makes them
  // anew under the same names, and a mapping of the old object must not be used for them.
  shm::Segment& segment(const std::string& name) {
    auto& s = segments[name];
    if (!s || s->identity() != shm::segment_identity(name)) {
      s = std::make_shared<shm::Segment>(shm::Segment::open(name, shm::Access::read_write));
      flag_tables.erase(name);
    }
    return *s;
  }
};

namespace {

// A step's view of the flags table: ShmFlagSync plus the mapping it points into.
class StepFlags : public FlagSync {
 public:
  StepFlags(std::shared_ptr<shm::FlagTable> table, std::chrono::steady_clock::time_point deadline,
            uint64_t issued_epoch)
      : table_(std::move(table)),
        sync_(*table_, deadline, shm::epoch_for_step(*table_, issued_epoch)) {}
  void wait(uint32_t flag, uint64_t seq, float predicted_us) override {
    sync_.wait(flag, seq, predicted_us);
  }
  void publish(uint32_t flag, uint64_t seq) override { sync_.publish(flag, seq); }

 private:
  std::shared_ptr<shm::FlagTable> table_;
  shm::ShmFlagSync sync_;
};

}  // namespace

ShmMemoryResolver::ShmMemoryResolver(const char* who)
    : mappings_(std::make_shared<Mappings>()), who_(who) {}

ResolvedMemory ShmMemoryResolver::operator()(const fb::ProgramT& program) {
  if (program.arena_segment.empty() || program.model_path.empty())
    throw Error(Errc::invalid_argument,
                "program '" + program.name + "' names no arena segment or model file");
  Mappings& m = *mappings_;
  auto& model = m.models[program.model_path];
  if (!model) {
    check_model_path(program.model_path);  // a peer names it: only configured dirs
    model = std::shared_ptr<GgufFile>(GgufFile::open(program.model_path));
  }
  ResolvedMemory r;
  shm::Segment& arena = m.segment(program.arena_segment);
  r.mem.arena = arena.data();
  r.mem.arena_bytes = arena.size();
  if (!program.kv_segment.empty()) {
    shm::Segment& kv = m.segment(program.kv_segment);
    r.mem.kv = kv.data();
    r.mem.kv_bytes = kv.size();
  }
  r.mem.weights = model->data();
  r.mem.weights_bytes = model->size();
  if (!program.flags_segment.empty()) {
    shm::Segment& flags_segment = m.segment(program.flags_segment);  // current object first
    auto& table = m.flag_tables[program.flags_segment];
    if (!table) table = std::make_shared<shm::FlagTable>(shm::FlagTable::attach(flags_segment));
    r.n_flags = table->size();
    r.make_flags = [table](std::chrono::steady_clock::time_point deadline, uint64_t issued_epoch) {
      return std::make_unique<StepFlags>(table, deadline, issued_epoch);
    };
    // Preemption (issue 9): the step's preempt flag lies past the programs' own flags. `inner`
    // (a StepFlags) holds the table for as long as the wrapper lives.
    r.make_preemptible = [table, who = std::string(who_)](
                             FlagSync& inner, const StepArgs& step,
                             std::chrono::steady_clock::time_point deadline) {
      return shm::make_preemptible_flags(*table, inner, step, deadline, who);
    };
  }
  r.keep_alive = mappings_;
  return r;
}

}  // namespace duet

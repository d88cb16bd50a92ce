#pragma once
// POSIX shared-memory segments, named per stack: "/duet-<stack>-<what>" (a file in /dev/shm).
//
// Ownership is explicit (iceoryx style): the process that create()s a segment owns its NAME;
// everyone else open()s it. A Segment object owns only its MAPPING (munmap in the destructor).
// The name is removed only by unlink(), by remove_stack_segments() (the supervisor's cleanup and
// the reclaim of a killed stack), or by the destructor of a segment created with
// Lifetime::unlink_on_destroy (tests and short-lived tools). A segment created with the default
// Lifetime::persist outlives its creator on purpose: a crashed service must not take the data
// plane with it; the supervisor removes the stack's segments on `down`.
//
// Names: the stack id is letters, digits, '-' and '_' (at most kMaxStackIdLength); the <what>
// part is letters, digits, '_' and '.', NO '-': so the last '-' of a name always separates the
// stack id from <what>, and stack "a" never matches the segments of stack "a-b".
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace duet::shm {

inline constexpr size_t kMaxStackIdLength = 32;
inline constexpr size_t kMaxWhatLength = 64;
inline constexpr const char* kShmDir = "/dev/shm";  // where Linux keeps shm_open names

// Throw Errc::invalid_argument naming the problem.
void validate_stack_id(std::string_view stack_id);
void validate_segment_what(std::string_view what);

// What a structure's format() checks of the memory it is given: `base` aligned to `alignment`
// bytes (Errc::invalid_argument) and `bytes` at least `needed` (Errc::out_of_range), each error
// naming the structure (`what`: "flag table") and what needs the bytes (`layout`: "4 flags").
void check_format_region(const void* base, uint64_t bytes, size_t alignment, uint64_t needed,
                         std::string_view what, const std::string& layout);

// "/duet-<stack>-<what>", both parts validated.
std::string segment_name(std::string_view stack_id, std::string_view what);

// Names ("/duet-<stack>-<what>") of the stack's segments that exist now, sorted.
std::vector<std::string> list_stack_segments(std::string_view stack_id);
// Unlinks every segment of the stack; returns how many it removed. Mappings that processes
// still hold stay valid until they unmap.
size_t remove_stack_segments(std::string_view stack_id);

enum class Access { read_write, read_only };
enum class Lifetime {
  persist,            // the name stays until unlink() / remove_stack_segments()
  unlink_on_destroy,  // the creating object's destructor unlinks the name too
};

class Segment {
 public:
  // O_CREAT|O_EXCL, mode 0600 (fchmod, whatever the umask), sized and backed by memory up front
  // (posix_fallocate: a full /dev/shm is an error here, never a SIGBUS later). Zero-filled.
  // Errors: invalid_argument (name, bytes == 0), busy (the name exists), io (the OS refused).
  static Segment create(const std::string& name, size_t bytes,
                        Lifetime lifetime = Lifetime::persist);
  // Maps an existing segment whole. Errors: not_found, io, bad_format (empty segment).
  static Segment open(const std::string& name, Access access = Access::read_write);

  Segment() = default;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // Removes the name (the mapping stays valid). Throws io if the OS refuses; a name already
  // gone is not an error. After it the destructor unlinks nothing.
  void unlink();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool writable() const { return access_ == Access::read_write; }
  // Which shm object this maps (its inode). A name removed and created again (a restarted
  // frontend) is a different object under the same name: compare with segment_identity(name).
  uint64_t identity() const { return identity_; }
  bool valid() const { return data_ != nullptr; }

 private:
  void release() noexcept;

  std::string name_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  Access access_ = Access::read_write;
  bool unlink_on_destroy_ = false;
  uint64_t identity_ = 0;
};

// The identity (inode) of the object the name refers to now; 0 if there is none.
uint64_t segment_identity(const std::string& name);

}  // namespace duet::shm

// A same-host all-reduce (and all-gather, reduce-scatter) between CPU processes through one
// POSIX shared-memory segment.
//
// Layout: a header (one cache-line-aligned record per rank), then two buffers (even and odd
// rounds) of `world` slots of `slot_bytes` each. One round: every rank copies its chunk (or the
// operands of one call that fit in a slot together) into its slot of buffer (seq % 2),
// publishes `arrived = seq`, waits until every rank arrived at `seq`, then sums the slots in
// rank order into its output (so every rank gets bit-identical results). Round seq + 2 reuses
// the buffer only after every rank arrived at seq + 1, i.e. finished reading round seq: no
// overwrite can race a read. An all-gather copies the slots out in rank order instead; a
// reduce-scatter sends every rank's part of its operand and sums only its own part, in the
// same rank order as the all-reduce (so the same bits as the all-reduce's part).
//
// Waiting spins briefly, then sleeps on a futex in the segment; it is bounded by the timeout
// and watches the peers' pids, so a dead or failed peer gives an error naming it, never a hang.
// Built by stratax/_src/runtime/shm_build.py; driven by stratax/_src/runtime/shm_collectives.py.

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr uint64_t kMagic = 0x5354524154415831ULL;  // "STRATAX1"
constexpr int kMaxWorld = 64;

struct alignas(128) RankState {
  std::atomic<uint64_t> arrived;   // last round whose data this rank published
  std::atomic<uint32_t> failed;    // nonzero once this rank's collective failed
  int32_t pid;
  uint64_t signature[2];           // what the rank reduces in the round of each buffer
};

struct Header {
  uint64_t magic;
  uint32_t world;
  uint32_t pad;
  uint64_t slot_bytes;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> wake;      // futex word, bumped by every arrival
  std::atomic<uint32_t> waiters;
  RankState ranks[kMaxWorld];
};

struct State {
  std::mutex mu;
  Header* header = nullptr;
  char* data = nullptr;
  size_t map_bytes = 0;
  int rank = -1;
  int world = 0;
  uint64_t slot_bytes = 0;
  uint64_t seq = 0;
  double timeout_s = 120.0;
  double spin_s = 0.00005;  // how long a wait spins before sleeping on the futex
  std::string poisoned;  // set after a failure: every later call fails with it
};

State g_state;

size_t MapBytes(int world, uint64_t slot_bytes) {
  return sizeof(Header) + 2 * static_cast<size_t>(world) * slot_bytes;
}

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void SetError(char* err, int err_len, const std::string& message) {
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", message.c_str());
}

int Map(int fd, int world, uint64_t slot_bytes, char* err, int err_len) {
  size_t bytes = MapBytes(world, slot_bytes);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    SetError(err, err_len, std::string("mmap failed: ") + std::strerror(errno));
    return -1;
  }
  g_state.header = static_cast<Header*>(base);
  g_state.data = static_cast<char*>(base) + sizeof(Header);
  g_state.map_bytes = bytes;
  g_state.world = world;
  g_state.slot_bytes = slot_bytes;
  g_state.seq = 0;
  g_state.poisoned.clear();
  return 0;
}

// Tells the core that this thread spin-waits (a sibling hyper-thread gets the pipeline, and
// the core draws less power): x86's pause, ARM's yield; on other CPUs the loop just spins.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, long nanos) {
  timespec ts{0, nanos};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 0x7fffffff, nullptr,
          nullptr, 0);
}

void Publish(uint64_t seq) {
  Header* h = g_state.header;
  h->ranks[g_state.rank].arrived.store(seq, std::memory_order_seq_cst);
  h->wake.fetch_add(1, std::memory_order_seq_cst);
  if (h->waiters.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&h->wake);
}

// The first rank that has not arrived at `seq`, or -1 when all have.
int Missing(uint64_t seq) {
  for (int r = 0; r < g_state.world; ++r) {
    if (g_state.header->ranks[r].arrived.load(std::memory_order_acquire) < seq) return r;
  }
  return -1;
}

// False once `pid` has exited: gone, or a zombie its parent has not reaped yet (kill(pid, 0)
// still succeeds on a zombie, so /proc is read instead).
bool Alive(int32_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* file = std::fopen(path, "r");
  if (file == nullptr) return kill(pid, 0) == 0 || errno != ESRCH;
  char text[512];
  size_t n = std::fread(text, 1, sizeof(text) - 1, file);
  std::fclose(file);
  text[n] = '\0';
  const char* close = std::strrchr(text, ')');
  if (close == nullptr || close[1] == '\0' || close[2] == '\0') return true;
  return close[2] != 'Z' && close[2] != 'X';
}

std::string PeerProblem(int r) {
  RankState& peer = g_state.header->ranks[r];
  if (peer.failed.load(std::memory_order_acquire)) {
    return "process " + std::to_string(r) + " (pid " + std::to_string(peer.pid) +
           ") failed its own shared-memory all-reduce";
  }
  if (peer.pid > 0 && !Alive(peer.pid)) {
    return "process " + std::to_string(r) + " (pid " + std::to_string(peer.pid) + ") exited";
  }
  return "";
}

// Waits until every rank arrived at `seq`; an empty string on success, else why not.
std::string WaitAll(uint64_t seq) {
  Header* h = g_state.header;
  // Spin first: a peer on another core arrives within microseconds, while a futex wake-up
  // costs tens of them, and on a virtual machine a core that sleeps can lose its physical CPU
  // to another guest for a whole host time slice. spin_s is 50 us when processes share cores
  // and 1 s when each has its own (shm_collectives.py says why). A long spin yields the core
  // every ~100 us, so this process's other threads (input prefetch, the Python thread, gloo)
  // still run when they need it, and checks its peers as the sleeping wait below does.
  double start = Now();
  double next_check = start + 0.05;
  for (uint64_t i = 1;; ++i) {
    int missing = Missing(seq);
    if (missing < 0) return "";
    if ((i & 255) == 0) {
      double now = Now();
      if (now - start > g_state.spin_s || now - start > g_state.timeout_s) break;
      if (now >= next_check) {
        std::string problem = PeerProblem(missing);
        if (!problem.empty()) return problem;
        next_check = now + 0.05;
      }
      if ((i & 4095) == 0) sched_yield();
    }
    CpuRelax();
  }
  h->waiters.fetch_add(1, std::memory_order_seq_cst);
  std::string problem;
  for (;;) {
    uint32_t word = h->wake.load(std::memory_order_seq_cst);
    int missing = Missing(seq);
    if (missing < 0) break;
    double now = Now();
    if (now >= next_check) {
      problem = PeerProblem(missing);
      if (!problem.empty()) break;
      next_check = now + 0.05;
    }
    if (now - start > g_state.timeout_s) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%g", g_state.timeout_s);
      problem = "process " + std::to_string(missing) + " (pid " +
                std::to_string(h->ranks[missing].pid) + ") did not reach all-reduce round " +
                std::to_string(seq) + " within " + seconds + " s (the collective timeout)";
      break;
    }
    FutexWait(&h->wake, word, 1000000);  // 1 ms, then re-check peers and the deadline
  }
  h->waiters.fetch_sub(1, std::memory_order_seq_cst);
  return problem;
}

template <typename T>
T Combine(T a, T b, int op) {
  if (op == 0) return a + b;
  if (op == 1) return b > a ? b : a;
  return b < a ? b : a;
}

// out = slot 0 (op) slot 1 (op) ... in rank order, one pass over the first two slots. This
// rank's slot is read from `mine` (its input, the same bits, still in this core's cache).
template <typename T>
void Reduce(T* out, const T* mine, size_t count, int op, const char* buffer) {
  int world = g_state.world;
  auto slot = [&](int r) {
    return r == g_state.rank ? mine
                             : reinterpret_cast<const T*>(buffer + r * g_state.slot_bytes);
  };
  if (world == 1) {
    std::memcpy(out, mine, count * sizeof(T));
    return;
  }
  const T* a = slot(0);
  const T* b = slot(1);
  switch (op) {  // op hoisted out of the loops, so they vectorize
    case 0:
      for (size_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
      break;
    case 1:
      for (size_t i = 0; i < count; ++i) out[i] = b[i] > a[i] ? b[i] : a[i];
      break;
    default:
      for (size_t i = 0; i < count; ++i) out[i] = b[i] < a[i] ? b[i] : a[i];
  }
  for (int r = 2; r < world; ++r) {
    const T* in = slot(r);
    for (size_t i = 0; i < count; ++i) out[i] = Combine(out[i], in[i], op);
  }
}

bool ReduceTyped(ffi::DataType dtype, void* out, const void* mine, size_t bytes, int op,
                 const char* buffer) {
  switch (dtype) {
    case ffi::DataType::F32:
      Reduce(static_cast<float*>(out), static_cast<const float*>(mine), bytes / 4, op, buffer);
      return true;
    case ffi::DataType::F64:
      Reduce(static_cast<double*>(out), static_cast<const double*>(mine), bytes / 8, op, buffer);
      return true;
    case ffi::DataType::S32:
      Reduce(static_cast<int32_t*>(out), static_cast<const int32_t*>(mine), bytes / 4, op,
             buffer);
      return true;
    case ffi::DataType::S64:
      Reduce(static_cast<int64_t*>(out), static_cast<const int64_t*>(mine), bytes / 8, op,
             buffer);
      return true;
    case ffi::DataType::U32:
      Reduce(static_cast<uint32_t*>(out), static_cast<const uint32_t*>(mine), bytes / 4, op,
             buffer);
      return true;
    default:
      return false;
  }
}

ffi::Error Fail(const std::string& message) {
  g_state.poisoned = message;
  if (g_state.header != nullptr) {
    g_state.header->ranks[g_state.rank].failed.store(1, std::memory_order_release);
    g_state.header->wake.fetch_add(1, std::memory_order_seq_cst);
    FutexWakeAll(&g_state.header->wake);
  }
  return ffi::Error(ffi::ErrorCode::kAborted, message);
}

// What a call does with the slots of a round.
enum class Mode : int { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2 };

// How errors name a collective.
std::string Name(Mode mode) {
  switch (mode) {
    case Mode::kAllGather:
      return "stratax shared-memory all-gather";
    case Mode::kReduceScatter:
      return "stratax shared-memory reduce-scatter";
    default:
      return "stratax shared-memory all-reduce";
  }
}

// A piece of one operand that travels in a round: `bytes` of each rank's part. All-reduce:
// `in` reduced into `out`. All-gather: `in` copied to `out + r * stride` for every rank r.
// Reduce-scatter: the world parts `in + q * stride` (q = 0 .. world - 1) travel; part `rank`,
// reduced over ranks, lands in `out`.
struct Segment {
  const char* in;
  char* out;
  size_t bytes;
  ffi::DataType dtype;
  size_t stride;
};

constexpr size_t kAlign = 64;  // segments start on cache lines (slot_bytes is a multiple)

size_t Aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Slot bytes a segment of `bytes` takes: a reduce-scatter sends every rank's part.
size_t SlotBytes(Mode mode, size_t bytes) {
  return mode == Mode::kReduceScatter ? Aligned(bytes) * g_state.world : Aligned(bytes);
}

// One round: copy every segment into this rank's slot (one after the other, cache-line
// aligned), publish, wait, then combine each segment from the slots into its output. Several
// operands that fit in one slot share a round, so the caller needs no concatenated copy of
// them, and pays one barrier for all.
ffi::Error Round(const Segment* segments, size_t count, Mode mode, int op, uint64_t signature) {
  uint64_t seq = ++g_state.seq;
  int parity = static_cast<int>(seq & 1);
  char* buffer = g_state.data + parity * g_state.world * g_state.slot_bytes;
  Header* h = g_state.header;
  char* slot = buffer + g_state.rank * g_state.slot_bytes;
  for (size_t i = 0, offset = 0; i < count; offset += SlotBytes(mode, segments[i].bytes), ++i) {
    const Segment& s = segments[i];
    if (mode != Mode::kReduceScatter) {
      std::memcpy(slot + offset, s.in, s.bytes);
      continue;
    }
    for (int q = 0; q < g_state.world; ++q) {  // not its own part: it reads that from `in`
      if (q == g_state.rank) continue;
      std::memcpy(slot + offset + q * Aligned(s.bytes), s.in + q * s.stride, s.bytes);
    }
  }
  h->ranks[g_state.rank].signature[parity] = signature;
  Publish(seq);
  std::string problem = WaitAll(seq);
  if (!problem.empty()) {
    return Fail(Name(mode) + " (process " + std::to_string(g_state.rank) + "): " + problem +
                ". Check that process's log; the job cannot continue.");
  }
  for (int r = 0; r < g_state.world; ++r) {
    if (h->ranks[r].signature[parity] != signature) {
      return Fail(Name(mode) + ": process " + std::to_string(r) +
                  " exchanges a different tensor in round " + std::to_string(seq) +
                  " than process " + std::to_string(g_state.rank) +
                  " (the processes run different programs, or their collectives ran in a "
                  "different order); use STRATAX_CPU_COLLECTIVES=gloo for this program.");
    }
  }
  for (size_t i = 0, offset = 0; i < count; offset += SlotBytes(mode, segments[i].bytes), ++i) {
    const Segment& s = segments[i];
    if (mode == Mode::kAllGather) {
      for (int r = 0; r < g_state.world; ++r) {
        const char* from = r == g_state.rank ? s.in : buffer + r * g_state.slot_bytes + offset;
        std::memcpy(s.out + r * s.stride, from, s.bytes);
      }
      continue;
    }
    bool scatter = mode == Mode::kReduceScatter;
    const char* mine = scatter ? s.in + g_state.rank * s.stride : s.in;
    const char* parts = buffer + offset + (scatter ? g_state.rank * Aligned(s.bytes) : 0);
    if (!ReduceTyped(s.dtype, s.out, mine, s.bytes, op, parts)) {
      return Fail(Name(mode) + ": unsupported dtype");
    }
  }
  return ffi::Error::Success();
}

// The same on every rank for the same piece of the same collective (mixed into the round's
// signature, which every rank checks).
uint64_t PieceSignature(int64_t call_id, size_t operand, size_t total, ffi::DataType dtype,
                        int op, uint64_t chunk, Mode mode) {
  return (static_cast<uint64_t>(call_id) * 1000003ULL) ^ (static_cast<uint64_t>(operand) << 48) ^
         (total << 8) ^ (static_cast<uint64_t>(dtype) << 1) ^ static_cast<uint64_t>(op) ^
         (chunk << 40) ^ (static_cast<uint64_t>(mode) << 58);
}

// Operands whose rank parts fit in a slot share rounds (as many as fit, in order); a larger
// one goes alone, in slot-sized chunks. All-reduce: each result has its operand's size;
// all-gather: world times it (the ranks' operands in rank order); reduce-scatter: a world-th
// of it (part `rank` of the operand, reduced over the ranks).
ffi::Error Collective(ffi::RemainingArgs args, ffi::RemainingRets rets, Mode mode, int32_t op,
                      int64_t call_id) {
  std::lock_guard<std::mutex> lock(g_state.mu);
  if (g_state.header == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      Name(mode) + " called before the segment was set up");
  }
  if (!g_state.poisoned.empty()) return ffi::Error(ffi::ErrorCode::kAborted, g_state.poisoned);
  if (args.size() != rets.size()) {
    return ffi::Error::InvalidArgument(Name(mode) + " needs one result per operand");
  }
  size_t world = static_cast<size_t>(g_state.world);
  std::vector<Segment> pending;
  pending.reserve(args.size());
  size_t pending_bytes = 0;
  uint64_t pending_signature = 0;
  auto flush = [&]() -> ffi::Error {
    if (pending.empty()) return ffi::Error::Success();
    ffi::Error error = Round(pending.data(), pending.size(), mode, op, pending_signature);
    pending.clear();
    pending_bytes = 0;
    pending_signature = 0;
    return error;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    auto arg = args.get<ffi::AnyBuffer>(i);
    auto ret = rets.get<ffi::AnyBuffer>(i);
    if (arg.has_error()) return arg.error();
    if (ret.has_error()) return ret.error();
    ffi::DataType dtype = arg->element_type();
    size_t width = ffi::ByteWidth(dtype);
    size_t in_bytes = arg->size_bytes();
    size_t out_bytes = (*ret)->size_bytes();
    bool sizes_match = mode == Mode::kAllReduce   ? out_bytes == in_bytes
                       : mode == Mode::kAllGather ? out_bytes == world * in_bytes
                                                  : in_bytes == world * out_bytes;
    if (!sizes_match) {
      return ffi::Error::InvalidArgument(Name(mode) + ": operand " + std::to_string(i) +
                                         " and its result have mismatched sizes");
    }
    // `total`: bytes of one rank's part; `stride`: how far apart the parts lie.
    size_t total = mode == Mode::kReduceScatter ? out_bytes : in_bytes;
    size_t stride = mode == Mode::kAllGather ? in_bytes : total;
    const char* in = static_cast<const char*>(arg->untyped_data());
    char* out = static_cast<char*>((*ret)->untyped_data());
    if (SlotBytes(mode, total) <= g_state.slot_bytes) {
      if (pending_bytes + SlotBytes(mode, total) > g_state.slot_bytes) {
        ffi::Error error = flush();
        if (error.failure()) return error;
      }
      pending.push_back({in, out, total, dtype, stride});
      pending_bytes += SlotBytes(mode, total);
      pending_signature = pending_signature * 1099511628211ULL ^
                          PieceSignature(call_id, i, total, dtype, op, 0, mode);
      continue;
    }
    ffi::Error error = flush();
    if (error.failure()) return error;
    size_t per_part = mode == Mode::kReduceScatter ? g_state.slot_bytes / world : g_state.slot_bytes;
    size_t chunk_max = (per_part / kAlign) * kAlign / width * width;
    uint64_t chunk_index = 0;
    for (size_t offset = 0; offset < total; offset += chunk_max, ++chunk_index) {
      Segment chunk{in + offset, out + offset,
                    total - offset < chunk_max ? total - offset : chunk_max, dtype, stride};
      error = Round(&chunk, 1, mode, op,
                    PieceSignature(call_id, i, total, dtype, op, chunk_index, mode));
      if (error.failure()) return error;
    }
  }
  return flush();
}

// The call of every collective: `mode` 0 all-reduce (`op` 0 sum, 1 max, 2 min), 1 all-gather,
// 2 reduce-scatter of a sum.
ffi::Error Call(ffi::RemainingArgs args, ffi::RemainingRets rets, int32_t mode, int32_t op,
                int64_t call_id) {
  if (mode < 0 || mode > static_cast<int32_t>(Mode::kReduceScatter)) {
    return ffi::Error::InvalidArgument("stratax shared-memory collective: unknown mode " +
                                       std::to_string(mode));
  }
  return Collective(args, rets, static_cast<Mode>(mode), op, call_id);
}

}  // namespace

#define STRATAX_EXPORT __attribute__((visibility("default")))

extern "C" STRATAX_EXPORT XLA_FFI_Error* StrataxShmCollective(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(StrataxShmCollective, Call,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int32_t>("mode")
                                  .Attr<int32_t>("op")
                                  .Attr<int64_t>("call_id"));

extern "C" {

// Rank 0: creates the segment `name` (it must not exist) and maps it. 0 or -1 (see `err`).
STRATAX_EXPORT int stratax_shm_create(const char* name, int world, uint64_t slot_bytes, double timeout_s,
                       double spin_s, char* err, int err_len) {
  std::lock_guard<std::mutex> lock(g_state.mu);
  if (world < 1 || world > kMaxWorld) {
    SetError(err, err_len, "world size " + std::to_string(world) + " is outside 1.." +
                               std::to_string(kMaxWorld));
    return -1;
  }
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    SetError(err, err_len, std::string("shm_open(") + name + ") failed: " + std::strerror(errno));
    return -1;
  }
  // posix_fallocate, not ftruncate: the pages are reserved now, so a /dev/shm too small for
  // the segment (e.g. a container's 64 MB default) is an error here, not a SIGBUS mid-step.
  int reserve = posix_fallocate(fd, 0, static_cast<off_t>(MapBytes(world, slot_bytes)));
  if (reserve != 0) {
    SetError(err, err_len, std::string("reserving ") +
                               std::to_string(MapBytes(world, slot_bytes)) +
                               " bytes in /dev/shm failed: " + std::strerror(reserve));
    close(fd);
    shm_unlink(name);
    return -1;
  }
  if (Map(fd, world, slot_bytes, err, err_len) != 0) {
    shm_unlink(name);
    return -1;
  }
  Header* h = g_state.header;
  h->world = static_cast<uint32_t>(world);
  h->slot_bytes = slot_bytes;
  h->ranks[0].pid = getpid();
  g_state.rank = 0;
  g_state.timeout_s = timeout_s;
  g_state.spin_s = spin_s;
  h->attached.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
  return 0;
}

// Ranks > 0: maps the segment `name` that rank 0 created. 0 or -1 (see `err`).
STRATAX_EXPORT int stratax_shm_attach(const char* name, int rank, int world, uint64_t slot_bytes,
                       double timeout_s, double spin_s, char* err, int err_len) {
  std::lock_guard<std::mutex> lock(g_state.mu);
  int fd = shm_open(name, O_RDWR, 0600);
  if (fd < 0) {
    SetError(err, err_len, std::string("shm_open(") + name + ") failed: " +
                               std::strerror(errno) + " (is process 0 on this host?)");
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != MapBytes(world, slot_bytes)) {
    SetError(err, err_len, "the segment has the wrong size: the processes disagree on the world "
                           "size or STRATAX_SHM_SLOT_BYTES");
    close(fd);
    return -1;
  }
  if (Map(fd, world, slot_bytes, err, err_len) != 0) return -1;
  Header* h = g_state.header;
  if (reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->load(std::memory_order_acquire) !=
          kMagic || h->world != static_cast<uint32_t>(world)) {
    SetError(err, err_len, "the segment is not a stratax segment of this job");
    munmap(g_state.header, g_state.map_bytes);
    g_state.header = nullptr;
    return -1;
  }
  g_state.rank = rank;
  g_state.timeout_s = timeout_s;
  g_state.spin_s = spin_s;
  h->ranks[rank].pid = getpid();
  h->attached.fetch_add(1, std::memory_order_seq_cst);
  return 0;
}

// How many ranks have attached so far.
STRATAX_EXPORT int stratax_shm_attached(void) {
  std::lock_guard<std::mutex> lock(g_state.mu);
  return g_state.header == nullptr ? 0 : static_cast<int>(g_state.header->attached.load());
}

// Removes the segment's name (mapped memory lives on until every rank unmaps it).
STRATAX_EXPORT int stratax_shm_unlink(const char* name) { return shm_unlink(name); }

// Unmaps the segment (the name was unlinked by rank 0 once every rank attached).
STRATAX_EXPORT void stratax_shm_close(void) {
  std::lock_guard<std::mutex> lock(g_state.mu);
  if (g_state.header != nullptr) munmap(g_state.header, g_state.map_bytes);
  g_state.header = nullptr;
  g_state.data = nullptr;
  g_state.rank = -1;
}

}  // extern "C"

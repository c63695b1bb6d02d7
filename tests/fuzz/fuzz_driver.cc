#include "tests/fuzz/fuzz_driver.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "google/protobuf/stubs/logging.h"

namespace flatshard::fuzz {

void FuzzFailure(const char* file, int line, const char* condition, absl::string_view detail) {
  std::fprintf(stderr, "%s:%d: fuzz invariant broken: %s\n  %.*s\n", file, line, condition,
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

}  // namespace flatshard::fuzz

// Protobuf logs every string field with invalid UTF-8 it refuses to parse;
// a fuzzer produces millions, and the output would drown the summary.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)flatshard::fuzz::FuzzOneInput(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

#ifndef FLATSHARD_LIBFUZZER
namespace flatshard::fuzz {
namespace {

namespace fs = std::filesystem;

// One input may take this long before the driver calls it a hang.
constexpr unsigned kInputTimeoutS = 10;
// Mutants stay small: growth past this only makes every run slower.
constexpr size_t kMaxInputBytes = size_t{64} << 10;
// Accepted mutants join the pool the driver mutates, so it works its way
// past the parsers into the validation behind them (no coverage feedback
// here; libFuzzer has it).
constexpr size_t kMaxPool = 512;
constexpr char kFailureFile[] = "fuzz-failure-input";

// The input being run, for the failure handlers (async-signal-safe reads).
const char* volatile g_input_data = nullptr;
volatile size_t g_input_size = 0;

// Only async-signal-safe calls: it runs from signal handlers and ASan's death
// callback.
void SaveFailingInput() {
  const int fd = ::open(kFailureFile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  const char* data = g_input_data;
  size_t left = data == nullptr ? 0 : g_input_size;
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n <= 0) break;
    data += n;
    left -= static_cast<size_t>(n);
  }
  ::close(fd);
  constexpr char kNote[] = "fuzz driver: the failing input is in ./fuzz-failure-input\n";
  (void)!::write(STDERR_FILENO, kNote, sizeof(kNote) - 1);
}

void OnFatalSignal(int sig) {
  if (sig == SIGALRM) {
    constexpr char kNote[] = "fuzz driver: an input ran over its time limit (a hang)\n";
    (void)!::write(STDERR_FILENO, kNote, sizeof(kNote) - 1);
  }
  SaveFailingInput();
  ::signal(sig == SIGALRM ? SIGABRT : sig, SIG_DFL);
  ::raise(sig == SIGALRM ? SIGABRT : sig);
}

}  // namespace
}  // namespace flatshard::fuzz

// ASan reports through its own handlers and exits without a signal; this is
// how it lets a program run code first. Weak: absent without ASan. The name is
// the sanitizer runtime's, reserved identifier or not.
// NOLINTNEXTLINE(bugprone-reserved-identifier)
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace flatshard::fuzz {
namespace {

void InstallFailureHandlers() {
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGALRM}) ::signal(sig, OnFatalSignal);
  if (__sanitizer_set_death_callback != nullptr) {
    __sanitizer_set_death_callback(SaveFailingInput);
  }
}

bool RunOne(const std::string& input) {
  g_input_data = input.data();
  g_input_size = input.size();
  ::alarm(kInputTimeoutS);
  const bool accepted = FuzzOneInput(input);
  ::alarm(0);
  return accepted;
}

bool ReadFile(const fs::path& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

std::vector<Seed> LoadCorpus(const std::string& dir) {
  std::vector<Seed> seeds;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (!entry.is_regular_file()) continue;
    Seed seed{entry.path().filename().string(), ""};
    if (ReadFile(entry.path(), seed.bytes)) seeds.push_back(std::move(seed));
  }
  std::sort(seeds.begin(), seeds.end(),
            [](const Seed& a, const Seed& b) { return a.name < b.name; });
  return seeds;
}

// Values that sit on the boundaries parsers get wrong: type limits, special
// floats, YAML and JSON structure.
constexpr const char* kTokens[] = {
    "-1",
    "0",
    "2147483648",
    "-2147483649",
    "9223372036854775807",
    "18446744073709551616",
    "1e308",
    "-1e-308",
    "nan",
    ".nan",
    ".inf",
    "inf",
    "100000",
    "65536",
    "\"\"",
    "[]",
    "{}",
    "null",
    "~",
    "true",
    "\n",
    "\n  - ",
    ": ",
    "&a ",
    "*a",
    "\\u0000",
    ",",
    "\"",
    "'",
    "#",
};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  size_t Pick(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  // 1-4 random edits of `s`; `other` (another pool entry) feeds crossovers.
  std::string Mutate(std::string s, const std::string& other) {
    const size_t edits = 1 + Pick(4);
    for (size_t e = 0; e < edits; ++e) Edit(s, other);
    if (s.size() > kMaxInputBytes) s.resize(kMaxInputBytes);
    return s;
  }

 private:
  void Edit(std::string& s, const std::string& other) {
    switch (Pick(10)) {
      case 0:  // flip a bit
        if (!s.empty()) s[Pick(s.size())] ^= static_cast<char>(1u << Pick(8));
        break;
      case 1:  // truncate
        s.resize(Pick(s.size() + 1));
        break;
      case 2:  // insert a run of one random byte
        s.insert(Pick(s.size() + 1), 1 + Pick(16), static_cast<char>(rng_()));
        break;
      case 3:  // rewrite a digit: sizes, counts, enum values, field numbers
        for (size_t i = Pick(s.size()); i < s.size(); ++i) {
          if (s[i] >= '0' && s[i] <= '9') {
            s[i] = static_cast<char>('0' + Pick(10));
            break;
          }
        }
        break;
      case 4:  // one of the first bytes: length prefixes, the RPC type byte
        if (!s.empty()) s[Pick(std::min<size_t>(s.size(), 8))] = static_cast<char>(rng_());
        break;
      case 5: {  // cut a range out
        const size_t a = Pick(s.size() + 1);
        s.erase(a, Pick(s.size() - a + 1));
        break;
      }
      case 6: {  // duplicate a range in place: deeper nesting, repeated fields
        const size_t a = Pick(s.size() + 1);
        const std::string slice = s.substr(a, Pick(s.size() - a + 1));
        s.insert(Pick(s.size() + 1), slice);
        break;
      }
      case 7: {  // splice in a range of another input
        const size_t a = Pick(other.size() + 1);
        s.insert(Pick(s.size() + 1), other.substr(a, Pick(other.size() - a + 1)));
        break;
      }
      case 8: {  // overwrite at a random place with a boundary token
        const std::string token = kTokens[Pick(std::size(kTokens))];
        const size_t at = Pick(s.size() + 1);
        s.replace(at, Pick(std::min(token.size(), s.size() - at) + 1), token);
        break;
      }
      default:  // a random byte
        if (!s.empty()) s[Pick(s.size())] = static_cast<char>(rng_());
        break;
    }
  }

  std::mt19937_64 rng_;
};

struct Flags {
  double seconds = 5;
  uint64_t seed = 1;
  std::string corpus;
  std::string write_seeds;
  std::vector<std::string> files;
};

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
#ifdef FLATSHARD_FUZZ_CORPUS_DIR
  flags.corpus = FLATSHARD_FUZZ_CORPUS_DIR;
#endif
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--seconds" && has_value) {
      flags.seconds = std::atof(argv[++i]);
    } else if (arg == "--seed" && has_value) {
      flags.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--corpus" && has_value) {
      flags.corpus = argv[++i];
    } else if (arg == "--write-seeds" && has_value) {
      flags.write_seeds = argv[++i];
    } else {
      flags.files.push_back(arg);
    }
  }
  return flags;
}

int WriteSeeds(const std::vector<Seed>& corpus, const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  for (const Seed& seed : GeneratedSeeds(corpus)) {
    std::ofstream out(fs::path(dir) / seed.name, std::ios::binary | std::ios::trunc);
    out << seed.bytes;
    if (!out.flush()) {
      std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), seed.name.c_str());
      return 1;
    }
    std::printf("wrote %s/%s (%zu bytes)\n", dir.c_str(), seed.name.c_str(), seed.bytes.size());
  }
  return 0;
}

int RunFiles(const std::vector<std::string>& files) {
  for (const std::string& file : files) {
    std::string bytes;
    if (!ReadFile(file, bytes)) {
      std::fprintf(stderr, "cannot read %s\n", file.c_str());
      return 1;
    }
    std::printf("%s: %s\n", file.c_str(), RunOne(bytes) ? "accepted" : "refused");
  }
  return 0;
}

int Fuzz(const Flags& flags, const std::vector<Seed>& corpus, const char* program) {
  // The seeds first, unmutated: a valid one refused means the code under test
  // (or the corpus) broke, and a loop over mutants would not notice.
  std::vector<std::string> pool;
  for (const Seed& seed : corpus) {
    const bool accepted = RunOne(seed.bytes);
    if (!accepted && !absl::StartsWith(seed.name, "regress-")) {
      std::fprintf(stderr, "%s: the valid seed %s was refused\n", program, seed.name.c_str());
      return 1;
    }
    pool.push_back(seed.bytes);
  }
  using Clock = std::chrono::steady_clock;
  Mutator mutator(flags.seed);
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(flags.seconds));
  uint64_t runs = 0;
  uint64_t accepted = 0;
  double slowest_s = 0;
  for (Clock::time_point now = start; now < end; ++runs) {
    const std::string input =
        mutator.Mutate(pool[mutator.Pick(pool.size())], pool[mutator.Pick(pool.size())]);
    const bool ok = RunOne(input);
    const Clock::time_point after = Clock::now();
    slowest_s = std::max(slowest_s, std::chrono::duration<double>(after - now).count());
    now = after;
    if (!ok) continue;
    ++accepted;
    if (pool.size() < kMaxPool) {
      pool.push_back(input);
    } else if (corpus.size() < kMaxPool) {  // the seeds themselves stay
      pool[corpus.size() + mutator.Pick(kMaxPool - corpus.size())] = input;
    }
  }
  std::printf("%s: %zu seeds, %llu inputs in %.1fs, %llu accepted, slowest %.3fs, no failure\n",
              program, corpus.size(), static_cast<unsigned long long>(runs), flags.seconds,
              static_cast<unsigned long long>(accepted), slowest_s);
  return 0;
}

}  // namespace
}  // namespace flatshard::fuzz

int main(int argc, char** argv) {
  using namespace flatshard::fuzz;  // NOLINT(google-build-using-namespace): main only
  const Flags flags = ParseFlags(argc, argv);
  LLVMFuzzerInitialize(&argc, &argv);
  InstallFailureHandlers();
  if (!flags.files.empty()) return RunFiles(flags.files);
  const std::vector<Seed> corpus = LoadCorpus(flags.corpus);
  if (!flags.write_seeds.empty()) return WriteSeeds(corpus, flags.write_seeds);
  if (corpus.empty()) {
    std::fprintf(stderr, "%s: no seeds in the corpus directory '%s'\n", argv[0],
                 flags.corpus.c_str());
    return 1;
  }
  return Fuzz(flags, corpus, fs::path(argv[0]).filename().c_str());
}
#endif  // FLATSHARD_LIBFUZZER

// Tests worker/compute/npy.h and npy_data_source.h: NumPy's exact bytes, both
// header versions, every malformed or unsupported file failing with its name
// and the problem, and the file-backed data set (dense MSE, dense labels,
// token sequences) partitioning like the synthetic ones and cycling through
// the file.
#include "worker/compute/npy.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/compute/npy_data_source.h"

namespace flatshard::compute {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

template <typename T>
std::vector<T> As(const NpyArray& a) {
  std::vector<T> out(a.data.size() / sizeof(T));
  std::memcpy(out.data(), a.data.data(), a.data.size());
  return out;
}

// What numpy.save(f, numpy.arange(6, dtype='<f4').reshape(2, 3)) writes.
std::string NumpyArange23() {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  std::string header = dict + std::string(128 - 10 - dict.size() - 1, ' ') + "\n";
  std::string file = std::string("\x93NUMPY\x01\x00", 8) +
                     std::string(1, static_cast<char>(header.size())) + std::string(1, '\0') +
                     header;
  const std::vector<float> data = {0, 1, 2, 3, 4, 5};
  file.append(reinterpret_cast<const char*>(data.data()), data.size() * 4);
  return file;
}

TEST(NpyTest, ReadsAndWritesNumpysBytes) {
  const std::vector<float> data = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(EncodeNpy(DType::kFloat32, {2, 3}, Bytes(data)), NumpyArange23());
  auto array = ParseNpy(NumpyArange23(), "arange.npy");
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, DType::kFloat32);
  EXPECT_THAT(array->shape, ElementsAre(2, 3));
  EXPECT_EQ(As<float>(*array), data);
}

TEST(NpyTest, RoundTripsEveryDtypeAndRank) {
  const std::vector<int64_t> i64 = {-1, 0, 1LL << 40};
  auto a = ParseNpy(EncodeNpy(DType::kInt64, {3}, Bytes(i64)), "a.npy");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(As<int64_t>(*a), i64);
  const std::vector<int32_t> i32 = {7};
  auto scalar = ParseNpy(EncodeNpy(DType::kInt32, {}, Bytes(i32)), "s.npy");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(As<int32_t>(*scalar), i32);
  auto empty = ParseNpy(EncodeNpy(DType::kFloat32, {0, 4}, {}), "e.npy");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->numel(), 0);
}

TEST(NpyTest, ReadsVersion2Headers) {
  const std::string dict = "{\"descr\": \"<i4\", \"shape\": (2,), \"fortran_order\": False}   \n";
  std::string file = std::string("\x93NUMPY\x02\x00", 8);
  const auto len = static_cast<uint32_t>(dict.size());
  for (int i = 0; i < 4; ++i) file.push_back(static_cast<char>((len >> (8 * i)) & 0xFF));
  file += dict;
  const std::vector<int32_t> data = {4, 5};
  file.append(reinterpret_cast<const char*>(data.data()), 8);
  auto array = ParseNpy(file, "v2.npy");
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(As<int32_t>(*array), data);
}

struct BadNpy {
  const char* name;
  std::string bytes;
  absl::StatusCode code;
  const char* expected;
};

void PrintTo(const BadNpy& c, std::ostream* os) { *os << c.name; }

std::string WithHeader(const std::string& dict, const std::string& data = std::string(24, '\0')) {
  std::string header = dict + "\n";
  return std::string("\x93NUMPY\x01\x00", 8) + std::string(1, static_cast<char>(header.size())) +
         std::string(1, '\0') + header + data;
}

class BadNpyTest : public ::testing::TestWithParam<BadNpy> {};

TEST_P(BadNpyTest, FailsNamingTheFileAndTheProblem) {
  auto array = ParseNpy(GetParam().bytes, "bad.npy");
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), GetParam().code) << array.status();
  EXPECT_THAT(std::string(array.status().message()), StartsWith("bad.npy: "));
  EXPECT_THAT(std::string(array.status().message()), HasSubstr(GetParam().expected));
}

INSTANTIATE_TEST_SUITE_P(
    All, BadNpyTest,
    ::testing::Values(
        BadNpy{"not_npy", "PK\x03\x04 a zip file", absl::StatusCode::kInvalidArgument,
               "not a .npy file"},
        BadNpy{"truncated_data", NumpyArange23().substr(0, NumpyArange23().size() - 3),
               absl::StatusCode::kInvalidArgument,
               "data is truncated: shape (2, 3) of float32 needs 24 bytes, the file has 21"},
        BadNpy{"trailing_data", NumpyArange23() + "xx", absl::StatusCode::kInvalidArgument,
               "longer than its shape"},
        BadNpy{"truncated_header", NumpyArange23().substr(0, 60),
               absl::StatusCode::kInvalidArgument,
               "header claims 118 bytes but the file has only 50"},
        BadNpy{"preamble_only", std::string("\x93NUMPY\x02\x00\x01", 9),
               absl::StatusCode::kInvalidArgument, "ends inside its preamble"},
        BadNpy{"version", std::string("\x93NUMPY\x04\x00\x00\x00", 10),
               absl::StatusCode::kInvalidArgument, "unsupported .npy format version 4.0"},
        BadNpy{"no_newline", std::string("\x93NUMPY\x01\x00\x02\x00{}", 12),
               absl::StatusCode::kInvalidArgument, "header does not end with a newline"},
        BadNpy{"missing_key", WithHeader("{'descr': '<f4', 'shape': (6,), }"),
               absl::StatusCode::kInvalidArgument, "header has no 'fortran_order' key"},
        BadNpy{"unknown_key",
               WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': True}"),
               absl::StatusCode::kInvalidArgument, "unexpected .npy header key 'x'"},
        BadNpy{
            "duplicate_key",
            WithHeader("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}"),
            absl::StatusCode::kInvalidArgument, "key 'descr' appears twice"},
        BadNpy{"shape_not_tuple",
               WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (6)}"),
               absl::StatusCode::kInvalidArgument, "a 1-D shape is written (n,)"},
        BadNpy{"negative_shape",
               WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}"),
               absl::StatusCode::kInvalidArgument, "shape entries must be non-negative integers"},
        BadNpy{"garbage_after_dict",
               WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x"),
               absl::StatusCode::kInvalidArgument, "unexpected text after the dictionary"},
        BadNpy{"wrong_value_type",
               WithHeader("{'descr': '<f4', 'fortran_order': 0, 'shape': (6,)}"),
               absl::StatusCode::kInvalidArgument, "expected a string, True, False or a tuple"},
        BadNpy{"big_endian", WithHeader("{'descr': '>f4', 'fortran_order': False, 'shape': (6,)}"),
               absl::StatusCode::kUnimplemented, "dtype '>f4' is not supported"},
        BadNpy{"float64", WithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (3,)}"),
               absl::StatusCode::kUnimplemented, "dtype '<f8' is not supported"},
        BadNpy{"fortran", WithHeader("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}"),
               absl::StatusCode::kUnimplemented, "Fortran-order arrays are not supported"},
        BadNpy{"huge_shape",
               WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, "
                          "4294967296)}"),
               absl::StatusCode::kInvalidArgument, "is too large"}));

TEST(NpyTest, MissingFileIsNotFound) {
  auto array = ReadNpyFile("/nonexistent/dir/x.npy");
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(array.status().message()), HasSubstr("/nonexistent/dir/x.npy"));
}

class NpyDataSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string("npy_data_") +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  template <typename T>
  void Write(const std::string& name, DType dtype, std::vector<int64_t> shape,
             const std::vector<T>& v) {
    ASSERT_TRUE(WriteNpyFile((dir_ / name).string(), dtype, shape, Bytes(v)).ok());
  }

  DataSourceOptions Options(int64_t batch) const {
    DataSourceOptions o;
    o.kind = DataKind::kNpy;
    o.global_batch_size = batch;
    o.path = dir_.string();
    return o;
  }

  std::filesystem::path dir_;
};

TEST_F(NpyDataSourceTest, DenseRegressionPartitionsAndCycles) {
  std::vector<float> inputs(5 * 2), targets(5);
  for (size_t i = 0; i < inputs.size(); ++i) inputs[i] = static_cast<float>(i);
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = 100.0f + static_cast<float>(i);
  Write("inputs.npy", DType::kFloat32, {5, 2}, inputs);
  Write("targets.npy", DType::kFloat32, {5}, targets);
  auto data = MakeDataSource(Options(4));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->loss(), LossKind::kMse);
  // Step 1 is samples 4, 0, 1, 2 (mod 5); rank 1 of 2 gets samples 1 and 2.
  auto batch = (*data)->GetBatch(1, 1, 2);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->batch_size, 2);
  EXPECT_THAT(batch->inputs.values, ElementsAre(2, 3, 4, 5));
  EXPECT_THAT(batch->targets.values, ElementsAre(101, 102));
  EXPECT_EQ(batch->targets.cols, 1);
  auto whole = (*data)->GetBatch(1, 0, 1);
  ASSERT_TRUE(whole.ok());
  EXPECT_THAT(whole->targets.values, ElementsAre(104, 100, 101, 102));
  EXPECT_EQ((*data)->GetBatch(0, 0, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NpyDataSourceTest, LabelsAndTokens) {
  Write("inputs.npy", DType::kFloat32, {4, 3}, std::vector<float>(12, 0.5f));
  Write("labels.npy", DType::kInt64, {4}, std::vector<int64_t>{0, 2, 1, 2});
  DataSourceOptions o = Options(2);
  o.output_features = 3;
  auto data = MakeDataSource(o);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->loss(), LossKind::kCrossEntropy);
  auto batch = (*data)->GetBatch(1, 0, 1);
  ASSERT_TRUE(batch.ok());
  EXPECT_THAT(batch->labels, ElementsAre(1, 2));

  std::filesystem::remove(dir_ / "inputs.npy");
  std::filesystem::remove(dir_ / "labels.npy");
  Write("inputs.npy", DType::kInt32, {2, 3}, std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  Write("labels.npy", DType::kInt32, {2, 3}, std::vector<int32_t>{2, 3, 4, 5, 6, 7});
  o.vocab_size = 8;
  o.seq_len = 3;
  auto tokens = MakeDataSource(o);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  auto tb = (*tokens)->GetBatch(0, 1, 2);
  ASSERT_TRUE(tb.ok());
  EXPECT_EQ(tb->seq_len, 3);
  EXPECT_THAT(tb->ids, ElementsAre(4, 5, 6));
  EXPECT_THAT(tb->labels, ElementsAre(5, 6, 7));
}

TEST_F(NpyDataSourceTest, InconsistentFilesFailNamingTheFile) {
  auto message = [&](const DataSourceOptions& o) {
    auto data = MakeDataSource(o);
    EXPECT_FALSE(data.ok());
    return std::string(data.status().message());
  };
  EXPECT_THAT(message(Options(2)), HasSubstr("needs exactly one of targets.npy (MSE) and "
                                             "labels.npy (cross-entropy), found neither"));
  Write("inputs.npy", DType::kFloat32, {4, 3}, std::vector<float>(12, 0.5f));
  Write("targets.npy", DType::kFloat32, {3, 1}, std::vector<float>(3, 0.5f));
  EXPECT_THAT(message(Options(2)), HasSubstr("targets.npy: has shape (3, 1) but " +
                                             (dir_ / "inputs.npy").string() + " has 4 samples"));
  Write("labels.npy", DType::kInt32, {4}, std::vector<int32_t>{0, 1, 2, 3});
  EXPECT_THAT(message(Options(2)), HasSubstr("found both"));
  std::filesystem::remove(dir_ / "targets.npy");
  DataSourceOptions o = Options(2);
  o.output_features = 3;
  EXPECT_THAT(message(o), HasSubstr("labels.npy: value 3 at flat index 3 is outside [0, 3) "
                                    "(output_features)"));
  o.output_features = 0;
  o.input_features = 5;
  EXPECT_THAT(message(o),
              HasSubstr("inputs.npy: has 3 features per sample but input_features is 5"));
  std::filesystem::remove(dir_ / "labels.npy");
  Write("targets.npy", DType::kInt32, {4}, std::vector<int32_t>{0, 1, 2, 3});
  EXPECT_THAT(message(Options(2)), HasSubstr("MSE targets must be float32"));
  // A truncated file: the reader's error, naming it, comes through.
  const std::string bytes = EncodeNpy(DType::kFloat32, {4}, Bytes(std::vector<float>(4, 1.0f)));
  std::filesystem::remove(dir_ / "targets.npy");
  {
    std::FILE* f = std::fopen((dir_ / "targets.npy").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size() - 5, f);
    std::fclose(f);
  }
  EXPECT_THAT(message(Options(2)), HasSubstr("targets.npy: .npy data is truncated"));
}

}  // namespace
}  // namespace flatshard::compute

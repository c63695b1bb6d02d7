#include "client/text_dataset.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TextDatasetTest, WindowsAreConsecutiveBytesAndLabelsOneLater) {
  // 40 bytes: the first 30 train, the last 10 are held out.
  auto dataset = MakeTextDataset("abcdefghijklmnopqrstuvwxyz0123456789ABCD", 4, 0.25);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->bytes, 40);
  // (30 - 1) / 4 = 7 windows: the last label is byte 28 ('2').
  EXPECT_EQ(dataset->train.samples, 7);
  EXPECT_EQ(dataset->train.inputs.size(), 28u);
  EXPECT_EQ(dataset->train.inputs.front(), 'a');
  EXPECT_EQ(dataset->train.labels.front(), 'b');
  EXPECT_EQ(dataset->train.labels.back(), '2');
  EXPECT_EQ(dataset->validation.samples, 2);  // (10 - 1) / 4
  EXPECT_EQ(dataset->validation.inputs.front(), '4');
}

TEST(TextDatasetTest, ValidationIsTheHeldOutTail) {
  const std::string text = "0123456789abcdefghij";  // 20 bytes, 5 held out
  auto dataset = MakeTextDataset(text + text, 2, 0.25);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  // 40 bytes: train 30, validation the last 10 ("abcdefghij").
  EXPECT_EQ(dataset->validation.samples, 4);
  EXPECT_THAT(dataset->validation.inputs, ElementsAre('a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'));
  EXPECT_EQ(dataset->validation.labels.back(), 'i');
}

TEST(TextDatasetTest, BadOptionsAndShortTextAreRefusedNamingTheOption) {
  EXPECT_THAT(std::string(MakeTextDataset("abc", 0, 0.1).status().message()),
              HasSubstr("--seq-len must be > 0"));
  EXPECT_THAT(std::string(MakeTextDataset("abc", 1, 0.0).status().message()),
              HasSubstr("--validation-fraction must be in (0, 0.5]"));
  EXPECT_THAT(std::string(MakeTextDataset("abc", 1, 0.6).status().message()),
              HasSubstr("--validation-fraction"));
  auto short_text = MakeTextDataset("abcdefghij", 8, 0.1);
  EXPECT_EQ(short_text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_text.status().message()), HasSubstr("too few"));
}

TEST(TextDatasetTest, SqueezeSpacesKeepsNewlinesAndOneSpacePerRun) {
  EXPECT_EQ(SqueezeSpaces("  a \t\t b\n\n    c  "), " a b\n\n c ");
  EXPECT_EQ(SqueezeSpaces(""), "");
}

TEST(TextDatasetTest, BytesRoundTripIncludingUtf8) {
  const std::string text = "caf\xc3\xa9 \x01\xff";
  const std::vector<int32_t> ids = EncodeBytes(text);
  EXPECT_EQ(ids[3], 0xc3);
  EXPECT_EQ(ids.back(), 0xff);
  EXPECT_EQ(DecodeBytes(ids), text);
}

}  // namespace
}  // namespace flatshard

// .npy round trips for every supported dtype, and clear errors for files we cannot read.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/npy.h"
#include "core/rng.h"

namespace ft {
namespace {

class Npy : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("ft_npy_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a file with the given header dict and `data_bytes` bytes of payload.
  std::string write_raw(const std::string& name, const std::string& dict, size_t data_bytes) {
    std::string header = dict;
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream out(path(name), std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    const char len[2] = {static_cast<char>(header.size() & 0xff),
                         static_cast<char>(header.size() >> 8)};
    out.write(len, 2);
    out << header << std::string(data_bytes, '\1');
    return path(name);
  }

  void expect_error(const std::string& file, const std::string& part) {
    try {
      npy::load(file);
      ADD_FAILURE() << "no error for " << file;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }

  std::filesystem::path dir_;
};

TEST_F(Npy, RoundTripsEveryDtype) {
  Rng rng(3);
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    Tensor t = Tensor::empty({3, 5, 7}, dtype);
    fill_normal(t, rng);
    npy::save(path("t.npy"), t);
    const Tensor back = npy::load(path("t.npy"));
    EXPECT_EQ(back.dtype(), dtype);
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_EQ(std::memcmp(back.raw(), t.raw(), t.nbytes()), 0) << dtype_name(dtype);
  }
  Tensor ids = Tensor::empty({4}, DType::i32);
  for (int i = 0; i < 4; ++i) ids.data<int32_t>()[i] = i - 1;
  npy::save(path("ids.npy"), ids);
  const Tensor back = npy::load(path("ids.npy"));
  EXPECT_EQ(back.shape(), Shape{4});
  EXPECT_EQ(back.data<int32_t>()[0], -1);
  EXPECT_EQ(back.data<int32_t>()[3], 2);
  EXPECT_FALSE(std::filesystem::exists(path("ids.npy.tmp." + std::to_string(getpid()))));
}

TEST_F(Npy, HeaderIsAlignedAndReadable) {
  npy::save(path("a.npy"), Tensor::zeros({2, 3}, DType::f32));
  std::ifstream in(path("a.npy"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ((bytes.size() - 24) % 64, 0u);
  EXPECT_NE(bytes.find("'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"),
            std::string::npos);
  npy::save(path("s.npy"), Tensor::zeros({5}, DType::f32));
  std::ifstream in1(path("s.npy"), std::ios::binary);
  std::string one((std::istreambuf_iterator<char>(in1)), std::istreambuf_iterator<char>());
  EXPECT_NE(one.find("'shape': (5,)"), std::string::npos);
}

TEST_F(Npy, BadFilesGiveClearErrors) {
  expect_error(path("absent.npy"), "cannot open");
  { std::ofstream(path("junk.npy")) << "hello world, not numpy"; }
  expect_error(path("junk.npy"), "bad magic");
  expect_error(
      write_raw("fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16),
      "Fortran");
  expect_error(write_raw("u8.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", 4),
               "'|u1'");
  expect_error(
      write_raw("big.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", 16),
      "'>f4'");
  expect_error(
      write_raw("short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }", 60),
      "truncated");
  const std::string ok =
      write_raw("ok.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", 12);
  EXPECT_EQ(npy::load(ok).shape(), Shape{3});
}

// Sizes in the header are checked against the file before anything is allocated for them
// (the fuzzer's findings: tests/fuzz/corpus/npy/regress-*).
TEST_F(Npy, HeaderSizesBeyondTheFileAreRefused) {
  const std::string huge = write_raw(
      "huge.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }", 8);
  expect_error(huge, "needs 4000000000000 data bytes, found 8");
  expect_error(write_raw("overflow.npy",
                         "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, "
                         "4294967296), }",
                         8),
               "needs more than 2^63 data bytes");
  expect_error(write_raw("dim.npy",
                         "{'descr': '<f4', 'fortran_order': False, 'shape': "
                         "(99999999999999999999,), }",
                         8),
               "dimension out of range");
  {  // version 2: a 4-byte header length, here far past the end of the file
    std::ofstream out(path("v2.npy"), std::ios::binary);
    out.write("\x93NUMPY\x02\x00\xff\xff\xff\x7f{}", 14);
  }
  expect_error(path("v2.npy"), "the header says 2147483647 bytes, the file has 2");
}

// Token ids come as NumPy's default int64 as often as int32: both read as int32, and an int64
// that int32 cannot hold is an error naming the value, not a silent wrap.
TEST_F(Npy, LoadIdsReadsInt32AndInt64) {
  const std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }";
  const int64_t values[6] = {0, 1, 50256, 7, 2147483647, -1};
  const std::string file = write_raw("i8.npy", dict, 0);
  {
    std::ofstream out(file, std::ios::binary | std::ios::app);
    out.write(reinterpret_cast<const char*>(values), sizeof values);
  }
  const Tensor ids = npy::load_ids(file);
  ASSERT_EQ(ids.dtype(), DType::i32);
  ASSERT_EQ(ids.shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(ids.data<int32_t>()[i], values[i]) << i;
  // npy::load itself still refuses int64 (no such tensor dtype).
  expect_error(file, "'<i8'");

  Tensor i32 = Tensor::empty({3}, DType::i32);
  for (int i = 0; i < 3; ++i) i32.data<int32_t>()[i] = 10 * i;
  npy::save(path("i4.npy"), i32);
  EXPECT_EQ(npy::load_ids(path("i4.npy")).data<int32_t>()[2], 20);

  auto expect_ids_error = [&](const std::string& f, const std::string& part) {
    try {
      npy::load_ids(f);
      ADD_FAILURE() << "no error for " << f;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  // '\1' bytes: each int64 is 0x0101010101010101, beyond int32.
  expect_ids_error(
      write_raw("wide.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", 16),
      "72340172838076673");
  expect_ids_error(
      write_raw("cut.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", 24),
      "truncated");
  expect_ids_error(
      write_raw("f4.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8), "'<f4'");
  // A header that claims more than the file holds is refused before anything that size exists.
  expect_ids_error(
      write_raw("huge.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (100000000000,), }",
                8),
      "truncated");
}

}  // namespace
}  // namespace ft

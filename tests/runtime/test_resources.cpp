// IdPool and PageTable: allocation order, exhaustion, counts, rewinds and release.
#include <gtest/gtest.h>

#include "runtime/resources.h"
#include "util/check.h"

using namespace lily;

TEST(Resources, IdPoolHandsOutTheLowestFreeId) {
  IdPool p(3);
  EXPECT_EQ(p.capacity(), 3);
  EXPECT_EQ(*p.alloc(), 0);
  EXPECT_EQ(*p.alloc(), 1);
  EXPECT_EQ(*p.alloc(), 2);
  EXPECT_FALSE(p.alloc().has_value());
  EXPECT_EQ(p.in_use(), 3);
  p.free(1);
  p.free(0);
  EXPECT_EQ(p.available(), 2);
  EXPECT_EQ(*p.alloc(), 0);
  EXPECT_EQ(*p.alloc(), 1);
  EXPECT_THROW(p.free(7), Error);
  p.free(2);
  EXPECT_THROW(p.free(2), Error);  // twice
}

TEST(Resources, PageTableReservesTruncatesAndReleases) {
  IdPool pages(5);
  PageTable a(4), b(4);
  EXPECT_TRUE(a.reserve(pages, 1));
  EXPECT_EQ(a.pages(), (std::vector<int>{0}));
  EXPECT_TRUE(a.reserve(pages, 4));  // still one page
  EXPECT_EQ(a.capacity_tokens(), 4);
  EXPECT_TRUE(b.reserve(pages, 9));  // three pages
  EXPECT_EQ(b.pages(), (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(a.reserve(pages, 13));  // needs three more, one is free: nothing taken
  EXPECT_EQ(a.pages().size(), 1u);
  EXPECT_EQ(pages.available(), 1);
  b.truncate(pages, 5);  // a rewind keeps tokens [0, 5): two pages
  EXPECT_EQ(b.pages(), (std::vector<int>{1, 2}));
  EXPECT_TRUE(a.reserve(pages, 12));
  EXPECT_EQ(a.pages(), (std::vector<int>{0, 3, 4}));
  a.release(pages);
  b.release(pages);
  EXPECT_EQ(pages.in_use(), 0);
  EXPECT_EQ(a.capacity_tokens(), 0);
}

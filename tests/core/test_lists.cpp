// The one list parser (core/lists.hpp) and the layer sets built on it (model/config.hpp).
#include <gtest/gtest.h>

#include "quintet/core/lists.hpp"
#include "quintet/model/config.hpp"

using namespace quintet;

TEST(Lists, SplitTrimsAndDropsEmptyItems) {
    EXPECT_EQ(split_list(" a, b ,,c "), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(split_list("x y", ' '), (std::vector<std::string>{"x", "y"}));
    EXPECT_TRUE(split_list("").empty());
}

TEST(Lists, IntegersWithAndWithoutRanges) {
    EXPECT_EQ(*parse_int_list("3"), (std::vector<int>{3}));
    EXPECT_EQ(*parse_int_list("0, 2,5"), (std::vector<int>{0, 2, 5}));
    EXPECT_EQ(*parse_int_list("0,2-5", true), (std::vector<int>{0, 2, 3, 4, 5}));
    EXPECT_EQ(parse_int_list("3-60", true)->size(), 58u);  // DeepSeek-V3's MoE layers
    EXPECT_EQ(*parse_int_list("-1"), (std::vector<int>{-1}));  // syntax only: the caller checks the range
    for (const char* bad : {"", ",", "1,,2", "1,", "a", "1.5", "3-", "-", "5-3", "1 2"})
        EXPECT_FALSE(parse_int_list(bad, true)) << "'" << bad << "'";
    EXPECT_FALSE(parse_int_list("2-5", false));  // ranges only where asked for
}

TEST(Lists, LayerSets) {
    LayerSet s;
    EXPECT_TRUE(s.all());
    EXPECT_TRUE(s.contains(123));
    ASSERT_TRUE(s.parse("0,3-5"));
    EXPECT_EQ(s.text(), "0,3-5");
    EXPECT_FALSE(s.all());
    EXPECT_TRUE(s.contains(0) && s.contains(4) && s.contains(5));
    EXPECT_FALSE(s.contains(1) || s.contains(6));
    EXPECT_FALSE(s.parse("first"));
    EXPECT_EQ(s.text(), "0,3-5");  // unchanged by a failed parse
    ASSERT_TRUE(s.parse("all"));
    EXPECT_TRUE(s.contains(7));
}

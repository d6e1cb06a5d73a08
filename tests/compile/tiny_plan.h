// The compiled Plan of a tiny-moe strategy at 64 tokens per sequence, for the Plan and plan-file tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "piper/compile/compile.h"
#include "piper/spec/model_loader.h"

namespace piper::compile {

inline Plan compiled(const std::string& text) {
  auto model = load_model("tiny-moe");
  EXPECT_TRUE(model.ok());
  auto s = Strategy::parse(text);
  EXPECT_TRUE(s.ok()) << s.status().message();
  TrainSpec t;
  t.seq_len = 64;
  t.global_batch = s->global_batch();
  auto r = compile_strategy(*model, t, *s);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r->plan : Plan{};
}

}  // namespace piper::compile

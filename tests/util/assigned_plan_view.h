// What an agent holds of a plan after the assignments carried it: PackAssignedPlan then
// ExpandAssignedPlan (what each drops and rebuilds is checked field by field in
// tests/controller/assigned_plan_test.cc).
#pragma once

#include "gtest/gtest.h"
#include "tributary/v1/assigned_plan.h"

namespace tributary::testing {

inline tributary::v1::JobPlan AsAssigned(tributary::v1::JobPlan plan) {
  tributary::v1::PackAssignedPlan(plan);
  EXPECT_TRUE(tributary::v1::ExpandAssignedPlan(plan).ok());
  return plan;
}

}  // namespace tributary::testing

// The precompiled header of every test binary (tests/CMakeLists.txt, tributary_test): the
// third-party and generated headers that most tests include, parsed once per build instead of
// once per test source. Nothing of ours that changes often goes here; a test still includes what
// it uses.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <gmock/gmock.h>
#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tributary/v1/agent.grpc.pb.h"
#include "tributary/v1/controller.grpc.pb.h"
#include "tributary/v1/topology.pb.h"

// SendQueue: the hand-off of sends to a transport's progress thread (TCP and UCX share it).
#include "dataplane/transport/send_queue.h"

#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tributary::dataplane {
namespace {

struct Op {
  int id = 0;
};

using Pushed = SendQueue<Op>::Pushed;

std::unique_ptr<Op> MakeOp(int id) { return std::make_unique<Op>(Op{.id = id}); }

std::vector<int> Ids(const std::vector<std::unique_ptr<Op>>& ops) {
  std::vector<int> ids;
  for (const auto& op : ops) ids.push_back(op->id);
  return ids;
}

TEST(SendQueueTest, OtherThreadsQueueInOrderAndOnlyTheFirstWakes) {
  SendQueue<Op> queue;
  std::vector<Pushed> results;
  std::thread other([&] {
    for (int id = 1; id <= 3; ++id) {
      std::unique_ptr<Op> op = MakeOp(id);
      results.push_back(queue.Push(op));
      EXPECT_EQ(op, nullptr);
    }
  });
  other.join();
  EXPECT_EQ(results, (std::vector<Pushed>{Pushed::kQueuedWake, Pushed::kQueued, Pushed::kQueued}));
  bool stop = false;
  EXPECT_EQ(Ids(queue.Take(&stop)), (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(stop);
  std::unique_ptr<Op> op = MakeOp(4);
  EXPECT_EQ(queue.Push(op), Pushed::kQueuedWake);  // Empty again after Take.
}

TEST(SendQueueTest, SendsFromTheProgressThreadGoToTheLocalQueue) {
  SendQueue<Op> queue;
  queue.SetProgressThread();
  EXPECT_TRUE(queue.OnProgressThread());
  for (int id = 1; id <= 2; ++id) {
    std::unique_ptr<Op> op = MakeOp(id);
    EXPECT_EQ(queue.Push(op), Pushed::kQueued);  // Never a wake: the thread is awake.
  }
  bool stop = false;
  EXPECT_TRUE(queue.Take(&stop).empty());
  EXPECT_FALSE(queue.local_empty());
  EXPECT_EQ(queue.PopLocal()->id, 1);
  EXPECT_EQ(queue.PopLocal()->id, 2);
  EXPECT_EQ(queue.PopLocal(), nullptr);
  EXPECT_TRUE(queue.local_empty());
  queue.ClearProgressThread();
  EXPECT_FALSE(queue.OnProgressThread());
}

TEST(SendQueueTest, AStopSeenByTheProgressThreadClosesTheQueue) {
  SendQueue<Op> queue;
  std::unique_ptr<Op> before = MakeOp(1);
  ASSERT_EQ(queue.Push(before), Pushed::kQueuedWake);
  queue.RequestStop();
  std::unique_ptr<Op> after_request = MakeOp(2);
  EXPECT_EQ(queue.Push(after_request), Pushed::kQueued);  // Not seen yet: still queued.
  bool stop = false;
  EXPECT_EQ(Ids(queue.Take(&stop)), (std::vector<int>{1, 2}));
  EXPECT_TRUE(stop);
  std::unique_ptr<Op> late = MakeOp(3);
  EXPECT_EQ(queue.Push(late), Pushed::kClosed);
  ASSERT_NE(late, nullptr);  // Still the caller's, to fail with SendCancelled.
  EXPECT_EQ(late->id, 3);
}

TEST(SendQueueTest, CloseReturnsWhatIsLeftAndRefusesTheRest) {
  SendQueue<Op> queue;
  std::unique_ptr<Op> op = MakeOp(7);
  queue.Push(op);
  EXPECT_EQ(Ids(queue.Close()), std::vector<int>{7});
  std::unique_ptr<Op> late = MakeOp(8);
  EXPECT_EQ(queue.Push(late), Pushed::kClosed);
  EXPECT_TRUE(queue.Close().empty());
}

TEST(SendQueueTest, HandWakesOnceAndReturnsWhatAClosedQueueRefuses) {
  SendQueue<Op> queue;
  int wakes = 0;
  auto wake = [&] { ++wakes; };
  EXPECT_EQ(queue.Hand(MakeOp(1), wake), nullptr);
  EXPECT_EQ(queue.Hand(MakeOp(2), wake), nullptr);
  EXPECT_EQ(wakes, 1);
  queue.Close();
  std::unique_ptr<Op> refused = queue.Hand(MakeOp(3), wake);
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ(refused->id, 3);
  EXPECT_EQ(wakes, 1);
}

TEST(SendQueueTest, CheckSendTargetRejectsLongHeadersAndNamesThenParsesTheAddress) {
  const std::vector<std::byte> too_long(Transport::kMaxHeaderBytes + 1);
  absl::StatusOr<SocketAddress> status = CheckSendTarget("127.0.0.1:80", too_long);
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.status().message().find("127.0.0.1:80"), std::string::npos);
  const std::vector<std::byte> header(Transport::kMaxHeaderBytes);
  EXPECT_EQ(CheckSendTarget("localhost:80", header).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckSendTarget("127.0.0.1:80", header).ok());
  EXPECT_EQ(SendCancelled("1.2.3.4:5").code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace tributary::dataplane

#pragma once

// Happens-before edges that ThreadSanitizer cannot see, stated where our code relies on them.
//
// Debian's gRPC is not built with TSan: the completion queues and combiners by which it runs a
// reactor's reactions one after another, on whichever of its threads, synchronise through
// futexes and atomics inside the uninstrumented library. To TSan, a reactor built on one thread
// and used in OnDone on another looks like a race. A reactor states gRPC's guarantee itself:
// TRIBUTARY_TSAN_RELEASE(this) where it hands itself to gRPC (before StartCall, before a handler
// returns it) and at the end of each reaction that another may follow, and
// TRIBUTARY_TSAN_ACQUIRE(this) at the start of each reaction. Outside TSan builds they are no-ops.
// Only for edges a library really guarantees: an annotation that is not true hides real races.

#if defined(__SANITIZE_THREAD__)
#define TRIBUTARY_TSAN_ENABLED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TRIBUTARY_TSAN_ENABLED 1
#endif
#endif

#ifdef TRIBUTARY_TSAN_ENABLED
#include <sanitizer/tsan_interface.h>
#define TRIBUTARY_TSAN_RELEASE(addr) __tsan_release(static_cast<void*>(addr))
#define TRIBUTARY_TSAN_ACQUIRE(addr) __tsan_acquire(static_cast<void*>(addr))
#else
#define TRIBUTARY_TSAN_RELEASE(addr) static_cast<void>(addr)
#define TRIBUTARY_TSAN_ACQUIRE(addr) static_cast<void>(addr)
#endif

//! What a one-message publish costs the shard: `ringpost_daemon::profiling`'s requests, with
//! the allocations made while they ran counted here. For instructions, run it under callgrind
//! at two request counts and divide the difference (benches/README.md, 2026-12-07):
//!
//!   cargo build --release -p ringpost-daemon --features profiling --example one_message_publishes
//!   valgrind --tool=callgrind target/release/examples/one_message_publishes 1000
//!   valgrind --tool=callgrind target/release/examples/one_message_publishes 3000
//!
//! Arguments: requests (default 1000), requests in flight (64), data bytes (1024).

use ringpost_daemon::profiling::{one_message_publishes, Shape};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// The system's allocator, counting the allocations and reallocations made through it.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc` is `System.realloc`'s.
        unsafe { System.realloc(pointer, layout, size) }
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is `System.dealloc`'s.
        unsafe { System.dealloc(pointer, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let argument = |index: usize, default: usize| {
        std::env::args().nth(index).map_or(default, |text| text.parse().expect("a whole number"))
    };
    let shape =
        Shape { requests: argument(1, 1000), in_flight: argument(2, 64), data_bytes: argument(3, 1024) };
    let allocations = one_message_publishes(shape, || ALLOCATIONS.load(Ordering::Relaxed));
    println!(
        "{} requests of one {}-byte message, {} in flight: {} allocations ({:.2} per request)",
        shape.requests,
        shape.data_bytes,
        shape.in_flight,
        allocations,
        allocations as f64 / shape.requests as f64
    );
}

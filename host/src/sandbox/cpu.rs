//! The guests' CPU. The calls' tasks (each runs its call's guest, one handler call at a time) run on a
//! runtime of their own ([`spawn_call`]), beside the one that carries the host's I/O (connections to
//! Sent, the admin API): a tokio worker busy with guests looks at its sockets only every so many task
//! polls, so a connection's reader that shared workers with burning guests heard its socket tens of
//! milliseconds late (measured: 62 ms at the median beside four guests each burning 150 ms a frame, and
//! seconds before guests yielded every millisecond). The I/O threads, idle most of the time, are woken by
//! the kernel as soon as a socket has data. On the calls' runtime a running guest yields its worker at
//! every epoch tick ([`super::TICK`] while every worker is in a guest, [`super::IDLE_TICK`] otherwise),
//! so busy calls take turns with light ones a millisecond at a time: a call whose guest burns CPU is
//! slowed (its own queues fill, then shed, as the limits say), and its neighbours wait at most a few
//! ticks for a worker.
//!
//! What a call's polls take is what its CPU deadline counts ([`Share::used`]): the guest's own code, the
//! host's work inside its imports (copying a large list out of it) and for its HTTP requests in their
//! own tasks (TLS, HTTP, reading the body: [`charged`]), never the time it waits for a worker, for Sent or
//! for the network. (The guests' threads keep the host's priority: a lower one starved every
//! call's guest, the light ones too, on a machine shared with other processes.)

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

/// Task polls between two looks of a calls' worker at its sockets and timers (tokio's default is 61:
/// with polls of up to a tick each, a guest's HTTP exchange and its call's timers would wait that long).
const CALLS_EVENT_INTERVAL: u32 = 8;

/// Task polls between two looks of a calls' worker at the runtime's shared queue: every poll. A call's task
/// is woken from the I/O runtime (a frame for it), which puts it on that queue; a worker whose own queue
/// holds busy calls, each polled for up to a tick, looked there only every few polls, so a light call
/// waited behind several ticks of burning guests (measured beside four guests burning 150 ms a frame:
/// the neighbour's echo p50 1.1 ms, 0.3–0.6 ms with this; 1,000 calls' CPU per frame unchanged). The look
/// is an atomic load when the queue is empty. The other side: while frames keep coming faster than the
/// workers serve them, a task woken from within the runtime (a guest yielding, a timer) waits until the
/// shared queue is empty; overloaded calls are shed by their own queues (the limits' table).
const CALLS_GLOBAL_QUEUE_INTERVAL: u32 = 1;

/// The calls' runtime's workers: one per core the process may use.
static WORKERS: LazyLock<usize> =
    LazyLock::new(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get));

/// The runtime the calls' tasks run on.
static CALLS: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(*WORKERS)
        .thread_name("voicehost-calls")
        .event_interval(CALLS_EVENT_INTERVAL)
        .global_queue_interval(CALLS_GLOBAL_QUEUE_INTERVAL)
        .enable_all()
        .build()
        .expect("the calls' runtime starts")
});

/// Guest polls in progress, over the process.
static IN_GUEST: AtomicUsize = AtomicUsize::new(0);

/// Runs a call's task (its guest, and what waits on it) on the calls' runtime.
pub fn spawn_call<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    CALLS.spawn(task)
}

/// Whether every worker of the calls' runtime is in a guest now: then a call that becomes runnable waits
/// for one of them to yield, and the epoch ticks at its finest.
pub(super) fn contended() -> bool {
    IN_GUEST.load(Ordering::Relaxed) >= *WORKERS
}

/// A guest's worker at an epoch tick, before it yields to the calls' runtime: it yields its core too.
/// The host's I/O threads (a frame's read, its echo's write) are woken on cores that busy guests hold,
/// and the kernel runs them only once it preempts the guest: at its next scheduler tick (4 ms at
/// `HZ=250`), after the guest's slice. A yield lets a woken thread run now; when nothing else wants the
/// core it returns at once. Only a guest that runs through a tick pays for it (a syscall a tick).
pub(super) fn at_tick() {
    std::thread::yield_now();
}

/// What one call's handler calls have used of the guest CPU. Shared by the call's successive instances.
/// Host work charged between two handler calls (an HTTP request's, in its own task) counts toward the
/// next one: the guest cannot start requests and return to have their work go uncounted.
#[derive(Clone, Default)]
pub(super) struct Share(Arc<Counts>);

#[derive(Default)]
struct Counts {
    /// Everything charged, in nanoseconds.
    total: AtomicU64,
    /// `total` when the running handler call began to count.
    start: AtomicU64,
    /// `total` when the last handler call (or instantiation) ended.
    ended: AtomicU64,
}

impl Share {
    /// The guest time the running handler call (or instantiation) has used, in nanoseconds.
    pub(super) fn used(&self) -> u64 {
        let counts = &self.0;
        let total = counts.total.load(Ordering::Relaxed);
        total.saturating_sub(counts.start.load(Ordering::Relaxed))
    }

    /// A new handler call: it starts with what was charged since the last one ended.
    pub(super) fn restart(&self) {
        let counts = &self.0;
        let ended = counts.ended.load(Ordering::Relaxed);
        counts.start.store(ended, Ordering::Relaxed);
    }

    fn finish(&self) {
        let counts = &self.0;
        let total = counts.total.load(Ordering::Relaxed);
        counts.ended.store(total, Ordering::Relaxed);
    }

    fn charge(&self, spent: Duration) {
        let nanos = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.0.total.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// Marks the end of a handler call (or instantiation) when dropped, however it ended.
struct Finished<'a>(&'a Share);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// Counts a guest poll in progress until dropped (a poll that panics is counted out too).
struct InGuest;

impl InGuest {
    fn enter() -> InGuest {
        IN_GUEST.fetch_add(1, Ordering::Relaxed);
        InGuest
    }
}

impl Drop for InGuest {
    fn drop(&mut self) {
        IN_GUEST.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs `guest` (a handler call or an instantiation: guest code), charging the time of each of its polls
/// to `share`; what is charged after it ends counts toward the next.
pub(super) async fn run<F: Future>(share: &Share, guest: F) -> F::Output {
    let _finished = Finished(share);
    metered(share, guest).await
}

/// [`run`], owning its share, for host work done for a guest in a task of its own (its HTTP requests):
/// charged to the handler call running, or the next one.
pub(super) async fn charged<F: Future>(share: Share, work: F) -> F::Output {
    metered(&share, work).await
}

/// Charges the time of each of `work`'s polls to `share`.
async fn metered<F: Future>(share: &Share, work: F) -> F::Output {
    let mut guest = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        let _in_guest = InGuest::enter();
        let started = Instant::now();
        let polled = guest.as_mut().poll(cx);
        share.charge(started.elapsed());
        polled
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_guests_polls_are_charged_to_its_call_and_its_waits_are_not() {
        let share = Share::default();
        let spin = Duration::from_millis(5);
        run(&share, async {
            let started = Instant::now();
            while started.elapsed() < spin {
                std::hint::spin_loop();
            }
            // A wait (for Sent, for HTTP) costs nothing.
            tokio::time::sleep(Duration::from_millis(50)).await;
        })
        .await;
        let used = Duration::from_nanos(share.used());
        assert!(used >= spin && used < Duration::from_millis(50), "{used:?}");
        share.restart();
        assert_eq!(share.used(), 0);
    }

    #[tokio::test]
    async fn host_work_charged_between_two_handler_calls_counts_toward_the_next() {
        let share = Share::default();
        share.restart();
        run(&share, async {}).await;
        // A request's work, in its own task, after the handler returned.
        charged(share.clone(), async {
            std::thread::sleep(Duration::from_millis(5));
        })
        .await;
        share.restart();
        assert!(share.used() >= 5_000_000, "{}", share.used());
        run(&share, async {}).await;
        share.restart();
        assert!(share.used() < 5_000_000, "counted once: {}", share.used());
    }

    #[tokio::test]
    async fn a_calls_task_runs_on_the_calls_runtime() {
        let name = spawn_call(async { std::thread::current().name().map(str::to_string) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("voicehost-calls"));
    }
}

//! The calls' workers: every call's task (its guest, one handler call at a time) runs on one of these
//! threads, and when a worker is free it takes the runnable call that has used the least CPU: first the
//! group (a tenant, or the one agent of `voicehost run`) that has used the least, then that group's call
//! that has used the least. A running guest yields at every epoch tick (a millisecond while every worker is
//! busy: `cpu.rs`), so a light call waits for at most one tick of a busy one, whatever the number of busy
//! calls and whoever they belong to; a tenant with many busy calls gets the share of one group, not one
//! share per call. tokio's own scheduler serves tasks first come, first served, which gave a light call
//! one turn in every round of all the busy ones.
//!
//! What is counted is a task's whole poll (its guest's code, the host's work in its imports, the call's own
//! bookkeeping) as virtual time, as Linux's CFS does: a call or group that had nothing to run comes back
//! at most [`CREDIT`] behind the ones that kept running, so a call idle for an hour does not then hold the
//! workers for an hour. The tasks keep tokio's timers, channels and spawned tasks: each worker enters the
//! calls' tokio runtime (`cpu.rs`), whose own threads, otherwise idle, drive the timers and sockets.

use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// How far behind the calls (or groups) that kept running one that had nothing to run comes back: it
/// goes first, but cannot hold the workers longer than this on what it did not use.
const CREDIT: Duration = Duration::from_millis(20);

/// The calls whose CPU is weighed together against other groups': a tenant's, or one agent's.
#[derive(Clone)]
pub struct CpuGroup(Arc<GroupId>);

/// A group's key in the queue; its entry goes when the last handle does.
struct GroupId(u64);

impl CpuGroup {
    /// A group of its own.
    pub fn new() -> CpuGroup {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        CpuGroup(Arc::new(GroupId(NEXT.fetch_add(1, Ordering::Relaxed))))
    }
}

impl Default for CpuGroup {
    fn default() -> Self {
        CpuGroup::new()
    }
}

impl std::fmt::Debug for CpuGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuGroup({})", self.0 .0)
    }
}

impl Drop for GroupId {
    fn drop(&mut self) {
        if let Some(queue) = QUEUE.get() {
            queue.lock().groups.remove(&self.0);
        }
    }
}

/// Runs a call's task (its guest, and what waits on it) on the calls' workers, weighed within `group`.
/// The receiver gets its output (an error if it panicked); dropping it leaves the task running.
pub fn spawn_call<F>(group: &CpuGroup, task: F) -> tokio::sync::oneshot::Receiver<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (done, output) = tokio::sync::oneshot::channel();
    let task = Arc::new(Task {
        future: Mutex::new(Some(Box::pin(async move {
            let _ = done.send(task.await);
        }))),
        state: AtomicU8::new(QUEUED),
        used: AtomicU64::new(0),
        group: group.clone(),
    });
    queue().push(task, true);
    output
}

type BoxedTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A task's states: waiting for a wake-up, in the queue, being polled, woken while being polled, ended.
const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const RUNNING: u8 = 2;
const WOKEN: u8 = 3;
const ENDED: u8 = 4;

struct Task {
    future: Mutex<Option<BoxedTask>>,
    state: AtomicU8,
    /// The call's virtual time, in nanoseconds: what its polls took, raised to the group's clock less
    /// [`CREDIT`] when it comes back from having nothing to run.
    used: AtomicU64,
    group: CpuGroup,
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let next = match state {
                IDLE => QUEUED,
                RUNNING => WOKEN,
                _ => return,
            };
            match self
                .state
                .compare_exchange(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if next == QUEUED => return queue().push(self.clone(), true),
                Ok(_) => return,
                Err(now) => state = now,
            }
        }
    }
}

/// The runnable calls, by group.
struct Queue {
    inner: Mutex<Runnable>,
    ready: Condvar,
}

#[derive(Default)]
struct Runnable {
    groups: HashMap<u64, Group>,
    /// The groups with runnable calls, by their virtual time when they were put here.
    order: BTreeSet<(u64, u64)>,
    /// The virtual time of the group that ran last (only goes up).
    clock: u64,
    /// Ties are served in the order they came.
    seq: u64,
    /// Workers waiting for a call: a push wakes one only then (a wake-up is a system call).
    idle: usize,
}

#[derive(Default)]
struct Group {
    used: u64,
    /// The virtual time of this group's call that ran last (only goes up).
    clock: u64,
    /// Where the group is in `order`, while it has runnable calls.
    key: Option<(u64, u64)>,
    calls: BinaryHeap<Entry>,
}

/// A runnable call, least used first.
struct Entry {
    used: u64,
    seq: u64,
    task: Arc<Task>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.used, self.seq) == (other.used, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    // Reversed: `BinaryHeap` pops its greatest.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.used, other.seq).cmp(&(self.used, self.seq))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Runnable {
    /// Puts `task` in its group's queue; `came_back`: it had nothing to run until now.
    fn push(&mut self, task: Arc<Task>, came_back: bool) {
        let id = task.group.0 .0;
        let clock = self.clock;
        let group = self.groups.entry(id).or_insert_with(|| Group {
            used: clock,
            clock: 0,
            ..Group::default()
        });
        let mut used = task.used.load(Ordering::Relaxed);
        if came_back {
            used = used.max(group.clock.saturating_sub(nanos(CREDIT)));
            task.used.store(used, Ordering::Relaxed);
        }
        self.seq += 1;
        group.calls.push(Entry {
            used,
            seq: self.seq,
            task,
        });
        if group.key.is_none() {
            group.used = group.used.max(clock.saturating_sub(nanos(CREDIT)));
            let key = (group.used, id);
            group.key = Some(key);
            self.order.insert(key);
        }
    }

    /// The least used call of the least used group.
    fn pop(&mut self) -> Option<Arc<Task>> {
        // A group in `order` has an entry and a runnable call (its queued tasks hold its handle); should
        // that ever not hold, the group is skipped rather than the workers stopped with calls queued.
        let (group, entry, key) = loop {
            let key = self.order.pop_first()?;
            let Some(group) = self.groups.get_mut(&key.1) else {
                debug_assert!(false, "a group in the order has no entry");
                continue;
            };
            group.key = None;
            match group.calls.pop() {
                Some(entry) => break (group, entry, key),
                None => debug_assert!(false, "a group in the order has no runnable call"),
            }
        };
        self.clock = self.clock.max(group.used);
        group.clock = group.clock.max(entry.used);
        if !group.calls.is_empty() {
            let key = (group.used, key.1);
            group.key = Some(key);
            self.order.insert(key);
        }
        Some(entry.task)
    }

    /// What `task`'s poll took, counted to it and its group.
    fn charge(&mut self, task: &Task, spent: u64) {
        task.used.fetch_add(spent, Ordering::Relaxed);
        let id = task.group.0 .0;
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        group.used = group.used.saturating_add(spent);
        if let Some(old) = group.key {
            self.order.remove(&old);
            let key = (group.used, id);
            group.key = Some(key);
            self.order.insert(key);
        }
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Runnable> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, task: Arc<Task>, came_back: bool) {
        let mut runnable = self.lock();
        runnable.push(task, came_back);
        let idle = runnable.idle > 0;
        drop(runnable);
        if idle {
            self.ready.notify_one();
        }
    }

    /// A worker: takes the next call, polls it, counts what it took; for ever.
    fn work(&self) {
        let _tokio = super::cpu::calls_runtime().enter();
        loop {
            let task = {
                let mut runnable = self.lock();
                loop {
                    match runnable.pop() {
                        Some(task) => break task,
                        None => {
                            runnable.idle += 1;
                            runnable = self.ready.wait(runnable).unwrap_or_else(|p| p.into_inner());
                            runnable.idle -= 1;
                        }
                    }
                }
            };
            task.state.store(RUNNING, Ordering::Release);
            let started = Instant::now();
            let ended = poll(&task);
            let spent = nanos(started.elapsed());
            let mut runnable = self.lock();
            runnable.charge(&task, spent);
            if ended {
                task.state.store(ENDED, Ordering::Release);
            } else if task
                .state
                .compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Woken while it ran: straight back in the queue, with what it used.
                task.state.store(QUEUED, Ordering::Release);
                runnable.push(task.clone(), false);
                let idle = runnable.idle > 0;
                drop(runnable);
                if idle {
                    self.ready.notify_one();
                }
            }
            // `task` goes after the lock: the last handle of its group takes the lock to leave.
        }
    }
}

/// Polls `task` once; whether it has ended (done, or panicked: the panic is logged and the call's
/// task is gone, as a panicking tokio task is).
fn poll(task: &Arc<Task>) -> bool {
    let waker = Waker::from(task.clone());
    let mut cx = Context::from_waker(&waker);
    let mut future = task.future.lock().unwrap_or_else(|p| p.into_inner());
    let Some(running) = future.as_mut() else {
        return true;
    };
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        running.as_mut().poll(&mut cx)
    }));
    match polled {
        Ok(Poll::Pending) => false,
        Ok(Poll::Ready(())) => {
            *future = None;
            true
        }
        Err(_) => {
            tracing::error!("a call's task panicked: the call is gone");
            *future = None;
            true
        }
    }
}

static QUEUE: OnceLock<&'static Queue> = OnceLock::new();

/// The queue, its workers started on first use.
fn queue() -> &'static Queue {
    QUEUE.get_or_init(|| {
        let queue: &'static Queue = Box::leak(Box::new(Queue {
            inner: Mutex::new(Runnable::default()),
            ready: Condvar::new(),
        }));
        for _ in 0..super::cpu::workers() {
            std::thread::Builder::new()
                .name("voicehost-calls".into())
                .spawn(move || queue.work())
                .expect("a calls' worker starts");
        }
        queue
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(group: &CpuGroup, used: u64) -> Arc<Task> {
        Arc::new(Task {
            future: Mutex::new(None),
            state: AtomicU8::new(QUEUED),
            used: AtomicU64::new(used),
            group: group.clone(),
        })
    }

    fn same(a: &Arc<Task>, b: &Arc<Task>) -> bool {
        Arc::ptr_eq(a, b)
    }

    #[test]
    fn the_least_used_group_goes_first_then_its_least_used_call() {
        let (busy, light) = (CpuGroup::new(), CpuGroup::new());
        let mut runnable = Runnable::default();
        let (heavy_a, heavy_b, small) = (task(&busy, 0), task(&busy, 0), task(&light, 0));
        // The busy group's two calls run 100 ms and 50 ms, and are runnable again.
        for (heavy, spent) in [(&heavy_a, 100_000_000), (&heavy_b, 50_000_000)] {
            runnable.push(heavy.clone(), false);
            let ran = runnable.pop().unwrap();
            assert!(same(&ran, heavy));
            runnable.charge(&ran, spent);
            runnable.push(ran, false);
        }
        runnable.push(small.clone(), true);
        assert!(same(&runnable.pop().unwrap(), &small));
        // Within the busy group, the call that used less.
        assert!(same(&runnable.pop().unwrap(), &heavy_b));
        assert!(same(&runnable.pop().unwrap(), &heavy_a));
        assert!(runnable.pop().is_none());
    }

    #[test]
    fn a_call_that_had_nothing_to_run_comes_back_at_most_the_credit_behind() {
        let group = CpuGroup::new();
        let mut runnable = Runnable::default();
        let (busy, idle) = (task(&group, 0), task(&group, 0));
        runnable.push(busy.clone(), false);
        runnable.charge(&busy, 1_000_000_000);
        runnable.pop().unwrap();
        runnable.push(busy.clone(), false);
        runnable.pop().unwrap();
        // The idle call has used nothing in a second: it goes first, 20 ms behind, not a second.
        runnable.push(idle.clone(), true);
        assert_eq!(
            idle.used.load(Ordering::Relaxed),
            1_000_000_000 - nanos(CREDIT)
        );
    }

    #[test]
    fn a_groups_entry_goes_with_its_last_handle() {
        let group = CpuGroup::new();
        let id = group.0 .0;
        let ran = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(spawn_call(&group, async { 7 }));
        assert_eq!(ran, Ok(7));
        drop(group);
        // The worker lets the ended task go just after its output is sent.
        let deadline = Instant::now() + Duration::from_secs(5);
        while queue().lock().groups.contains_key(&id) {
            assert!(Instant::now() < deadline, "the group's entry stayed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[tokio::test]
    async fn a_calls_task_runs_on_the_calls_workers_with_tokios_timers() {
        let name = spawn_call(&CpuGroup::new(), async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            std::thread::current().name().map(str::to_string)
        })
        .await
        .unwrap();
        assert_eq!(name.as_deref(), Some("voicehost-calls"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_with_one_busy_call_gets_as_much_cpu_as_a_group_with_eight() {
        use std::sync::atomic::AtomicBool;
        let stop = Arc::new(AtomicBool::new(false));
        // Each task burns a millisecond, yields (as a guest does at each tick), and counts the turn.
        let burn = |group: &CpuGroup, turns: Arc<AtomicU64>| {
            let stop = stop.clone();
            spawn_call(group, async move {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    while started.elapsed() < Duration::from_millis(1) {
                        std::hint::spin_loop();
                    }
                    turns.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        };
        let (many, one) = (CpuGroup::new(), CpuGroup::new());
        let (many_turns, one_turns) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tasks: Vec<_> = (0..8).map(|_| burn(&many, many_turns.clone())).collect();
        tasks.push(burn(&one, one_turns.clone()));
        tokio::time::sleep(Duration::from_millis(400)).await;
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.unwrap();
        }
        let (many, one) = (
            many_turns.load(Ordering::Relaxed),
            one_turns.load(Ordering::Relaxed),
        );
        // Served first come, first served, the one would get a ninth; weighed by group, about half.
        assert!(
            one * 10 >= (many + one) * 3,
            "one group {one} turns, the other {many}"
        );
    }

    #[tokio::test]
    async fn a_panicking_task_ends_with_none_and_the_workers_go_on() {
        let panicked = spawn_call(&CpuGroup::new(), async { panic!("on purpose") }).await;
        assert!(panicked.is_err());
        assert_eq!(spawn_call(&CpuGroup::new(), async { 1 }).await, Ok(1));
    }
}

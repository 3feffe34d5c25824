//! The threads that carry connections and calls: one single-threaded runtime per core, shared by every
//! agent of the process. A connection's reader and writer and the tasks of the calls that start on it run on
//! one shard, so a frame's way from the reader through the guest to the writer wakes no other thread: a
//! work-stealing runtime wakes an idle worker (a futex call, a context switch) for nearly every task it
//! wakes, which cost about a third of the host's CPU per frame under load (BENCHMARKS.md). Connections are
//! spread over the shards in turn. A call resumed on a connection of another shard keeps its task where it
//! started (its frames then cross threads).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use tokio::runtime::{Builder, Handle};
use tokio::task::JoinHandle;

/// The process's shards.
pub struct Shards {
    handles: Vec<Handle>,
    next: AtomicUsize,
}

impl Shards {
    /// The process's shards, started on first use: one per core the process may use.
    pub fn get() -> &'static Shards {
        static SHARDS: OnceLock<Shards> = OnceLock::new();
        SHARDS.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Shards::start(cores)
        })
    }

    fn start(count: usize) -> Shards {
        let handles = (0..count)
            .map(|n| {
                let runtime = Builder::new_current_thread()
                    .enable_all()
                    .thread_name(format!("voicehost-shard-{n}"))
                    .build()
                    .expect("a shard's runtime (its timer and I/O driver) could not be built");
                let handle = runtime.handle().clone();
                std::thread::Builder::new()
                    .name(format!("voicehost-shard-{n}"))
                    .spawn(move || runtime.block_on(std::future::pending::<()>()))
                    .expect("a shard's thread could not be started");
                handle
            })
            .collect();
        Shards {
            handles,
            next: AtomicUsize::new(0),
        }
    }

    /// The shard the next connection goes to.
    pub fn next(&self) -> &Handle {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        &self.handles[n % self.handles.len()]
    }

    /// Runs `task` on the next shard.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.next().spawn(task)
    }
}

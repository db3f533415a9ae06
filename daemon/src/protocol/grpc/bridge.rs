//! How the gRPC API's handlers, on their tokio threads, reach a shard: a job sent over a
//! bounded channel to the shard, run there as a task of its own on the shard's executor, its
//! answer sent back on a one-shot. Only `tokio::sync` crosses, which needs no executor: the
//! shard awaits the channel as any future, and glommio wakes it when a tokio thread sends
//! (a foreign wake). Nothing of tokio's runtime is called from a shard, nor any shard's state
//! touched from a tokio thread: a job owns what it carries in, and sends out only owned values.

use crate::api::Status;
use futures_lite::future::BoxedLocal;
use std::future::Future;
use std::rc::Rc;

/// Jobs waiting for a shard to take them, per shard. A full queue makes the handler wait:
/// backpressure reaches the gRPC connection, which tonic stops reading.
pub const GRPC_JOBS_QUEUED_SHARD_MAX: usize = 1024;

/// Jobs a shard runs at once for the gRPC API; the next waits in the queue. Streams count
/// one each for as long as they are open, so this also bounds a shard's open gRPC streams.
pub const GRPC_JOBS_RUNNING_SHARD_MAX: usize = 4096;

/// Work for a shard: given the shard's target (`T`), a future that runs there.
pub type Job<T> = Box<dyn FnOnce(Rc<T>) -> BoxedLocal<()> + Send>;

/// The gRPC side's handle on one shard.
pub struct ShardCaller<T> {
    sender: tokio::sync::mpsc::Sender<Job<T>>,
}

impl<T> Clone for ShardCaller<T> {
    fn clone(&self) -> Self {
        ShardCaller { sender: self.sender.clone() }
    }
}

/// The shard's end: its jobs, in the order they were sent.
pub struct JobReceiver<T> {
    receiver: tokio::sync::mpsc::Receiver<Job<T>>,
}

/// A bounded job channel to one shard.
pub fn job_channel<T>() -> (ShardCaller<T>, JobReceiver<T>) {
    let (sender, receiver) = tokio::sync::mpsc::channel(GRPC_JOBS_QUEUED_SHARD_MAX);
    (ShardCaller { sender }, JobReceiver { receiver })
}

impl<T: 'static> ShardCaller<T> {
    /// Runs `work` on the shard and returns what it returned. `work` is built here and moved
    /// there, so it must be `Send`; the future it makes is made and run on the shard, so it
    /// need not be. `Unavailable` when the shard stopped (it stops taking jobs as it stops).
    pub async fn call<R, F, Fut>(&self, work: F) -> Result<R, Status>
    where
        R: Send + 'static,
        F: FnOnce(Rc<T>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job<T> = Box::new(move |target: Rc<T>| {
            Box::pin(async move {
                let _ = answer.send(work(target).await);
            })
        });
        self.sender.send(job).await.map_err(|_| stopping())?;
        answered.await.map_err(|_| stopping())
    }

    /// Like `call` for work that answers a `Result`, flattened.
    pub async fn try_call<R, F, Fut>(&self, work: F) -> Result<R, Status>
    where
        R: Send + 'static,
        F: FnOnce(Rc<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, Status>> + 'static,
    {
        self.call(work).await?
    }
}

fn stopping() -> Status {
    Status::unavailable("the server is stopping; retry (the client libraries reconnect by themselves)")
}

/// Runs the jobs sent to this shard, each as a task of its own, at most
/// `GRPC_JOBS_RUNNING_SHARD_MAX` at once, until every caller is gone or `stop` fires.
pub async fn serve_jobs<T: 'static>(mut jobs: JobReceiver<T>, target: Rc<T>, stop: crate::sync::Stop) {
    let running = Rc::new(glommio::sync::Semaphore::new(GRPC_JOBS_RUNNING_SHARD_MAX as u64));
    loop {
        let next = futures_lite::future::or(async { Some(jobs.receiver.recv().await) }, async {
            stop.given().await;
            None
        })
        .await;
        let Some(Some(job)) = next else { break };
        let Ok(permit) = running.acquire_static_permit(1).await else { break };
        let target = target.clone();
        crate::runtime::spawn(async move {
            job(target).await;
            drop(permit);
        })
        .detach();
    }
    // Callers still queued find the channel closed and answer `Unavailable`.
    jobs.receiver.close();
}

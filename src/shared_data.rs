//! The interfaces to proxy-wasm shared data and shared queues that the plain modules
//! ([`crate::lease`], [`crate::exchange`]) are written against, so they are tested natively;
//! the shim implements them with the host calls.

/// Shared data with the host's semantics: a read gives the value and its compare-and-swap
/// token; a write with a token fails if the value changed since, and a write without one (or
/// to a key that does not exist yet) always succeeds. Every call is one host call: the host's
/// process-wide shared-data mutex, two key strings and a copy of the value.
pub trait SharedStore {
    /// The value and token under `key`; `Some((None, None))` when absent, `None` on a host
    /// error.
    fn get(&self, key: &str) -> Option<(Option<Vec<u8>>, Option<u32>)>;
    /// Writes `value` under `key`; whether it was written.
    fn set(&self, key: &str, value: &[u8], token: Option<u32>) -> bool;
}

/// Shared queues with the host's semantics: a queue is registered under a name by the worker
/// whose thread is called back when something is enqueued to it, and resolved by name by the
/// others. Every call is one host call; an enqueue also posts a callback to the registering
/// worker's thread.
pub trait SharedQueues {
    /// Registers (or takes over) the queue `name` for this worker; its id.
    fn register(&self, name: &str) -> Option<u32>;
    /// The id of the queue another worker registered as `name`.
    fn resolve(&self, name: &str) -> Option<u32>;
    /// Appends `message` to the queue; whether it was taken.
    fn enqueue(&self, queue: u32, message: &[u8]) -> bool;
    /// Takes the oldest message of the queue, `None` when it is empty (or on a host error).
    fn dequeue(&self, queue: u32) -> Option<Vec<u8>>;
}

#[cfg(test)]
pub(crate) mod fake {
    use std::cell::{Cell, RefCell};
    use std::collections::{HashMap, VecDeque};

    use super::{SharedQueues, SharedStore};

    /// Shared data as the host implements it: one token counter for all writes, the token
    /// checked only when the key exists. Counts every call.
    #[derive(Default)]
    pub struct Host {
        data: RefCell<HashMap<String, (Vec<u8>, u32)>>,
        next_token: RefCell<u32>,
        queue_names: RefCell<HashMap<String, u32>>,
        queues: RefCell<HashMap<u32, VecDeque<Vec<u8>>>>,
        calls: Cell<usize>,
    }

    impl Host {
        /// Removes `key`, as if it had never been written.
        pub fn remove(&self, key: &str) {
            self.data.borrow_mut().remove(key);
        }

        /// Calls made so far.
        pub fn calls(&self) -> usize {
            self.calls.get()
        }
    }

    impl SharedStore for Host {
        fn get(&self, key: &str) -> Option<(Option<Vec<u8>>, Option<u32>)> {
            self.calls.set(self.calls.get() + 1);
            Some(match self.data.borrow().get(key) {
                Some((value, token)) => (Some(value.clone()), Some(*token)),
                None => (None, None),
            })
        }

        fn set(&self, key: &str, value: &[u8], token: Option<u32>) -> bool {
            self.calls.set(self.calls.get() + 1);
            let mut data = self.data.borrow_mut();
            if let (Some((_, current)), Some(token)) = (data.get(key), token) {
                if *current != token {
                    return false;
                }
            }
            let mut next = self.next_token.borrow_mut();
            *next += 1;
            data.insert(key.to_string(), (value.to_vec(), *next));
            true
        }
    }

    impl SharedQueues for Host {
        fn register(&self, name: &str) -> Option<u32> {
            self.calls.set(self.calls.get() + 1);
            let mut names = self.queue_names.borrow_mut();
            let next = names.len() as u32 + 1;
            let id = *names.entry(name.to_string()).or_insert(next);
            self.queues.borrow_mut().entry(id).or_default();
            Some(id)
        }

        fn resolve(&self, name: &str) -> Option<u32> {
            self.calls.set(self.calls.get() + 1);
            self.queue_names.borrow().get(name).copied()
        }

        fn enqueue(&self, queue: u32, message: &[u8]) -> bool {
            self.calls.set(self.calls.get() + 1);
            match self.queues.borrow_mut().get_mut(&queue) {
                Some(q) => {
                    q.push_back(message.to_vec());
                    true
                }
                None => false,
            }
        }

        fn dequeue(&self, queue: u32) -> Option<Vec<u8>> {
            self.calls.set(self.calls.get() + 1);
            self.queues.borrow_mut().get_mut(&queue)?.pop_front()
        }
    }
}

//! Watching a lock directory: waking flock waiters when a lock file is let go (in-process
//! notification, plus inotify close events for releases by other processes: Python, flock(1),
//! crashes), and telling holders when their lock file's name is unlinked, renamed over or made
//! again (inotify name events), so a replaced file is a lost lock at once.
//!
//! One hub per lock directory per process, shared by every store on that directory; one thread
//! per hub reads inotify (never one per waiter). A closed lock file is the only release another
//! process makes visible, and every way of letting go of a flock lock closes the file except an
//! explicit `LOCK_UN` or a demotion by a process that keeps it open; the waiters' safety-net
//! poll covers those.
//!
//! The directory is watched only for what someone waits for: close events only while a waiter
//! waits (they come with every open and close in the directory, measured at +2 µs on an
//! uncontended acquire and release), name events while a holder watches for its loss (they come
//! only when files are created, renamed or removed, which lock files rarely are). A waiter adds
//! the watch after its first refused attempt and attempts again before it waits, so no close is
//! missed; the last listener to leave narrows or removes it (its [`Subscription`] counts it),
//! so a busy directory does not keep paying for waiters that are gone.
//!
//! The inotify instance and its thread start with the first listener, not with the store: a
//! process that exits after having had an inotify mark (even one removed at once) waits for the
//! kernel to retire it, measured at 5–10 ms on this VM, more than `flock(1)`'s whole run. A
//! holder that never waits, as `xtr-lock run r -- true`, never makes one. Observers (a
//! holder's look-out for a revocation notice, an election's observer) see this process's
//! changes at once and others' releases only once the hub is [`OBSERVERS_EARLY`] old: their
//! watchers are best effort (they poll too), and a short-lived holder then makes no mark.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use tokio::sync::watch;

use super::line::Lines;
use super::name::slot_channel;
use super::records::Sidecar;
use crate::logging::TARGET;
use crate::mutex::lock;
use crate::store::channels::Channels;

pub(crate) struct Hub {
    dir: PathBuf,
    files: Mutex<Files>,
    /// The holders' records, beside the lock files.
    records: Sidecar,
    /// The inotify instance, started by the first listener ([`Hub::need`]); `None` inside when
    /// this system has none for us (or the directory cannot be watched).
    inotify: OnceLock<Option<Arc<OwnedFd>>>,
    /// When the hub started (see [`OBSERVERS_EARLY`]).
    born: tokio::time::Instant,
    /// This process's waiters, in line per lock file.
    lines: Arc<Lines>,
}

#[derive(Default)]
struct Files {
    /// Per lock file, and per semaphore for all its slot files: waiters for a release.
    releases: Channels,
    /// Per lock file, and per semaphore: holders watching names for a replacement.
    names: Channels,
    /// Per lock file, and per semaphore: observers of acquisitions and releases (an
    /// acquisition wakes them, not the waiters, whom it would only send back to wait).
    changes: Channels,
    /// The watch descriptor and its mask while the directory is watched.
    watching: Option<(i32, WatchFlags)>,
    /// Live subscriptions to releases and to names.
    release_listeners: usize,
    name_listeners: usize,
}

/// A registration for the next change of one lock file (a release, or a change of its name):
/// it wakes on every change after it was made, and leaves the directory's watch when the last
/// one goes.
pub(crate) struct Subscription {
    rx: watch::Receiver<u64>,
    hub: Arc<Hub>,
    names: bool,
    /// Counted among the directory watch's listeners (an early observer's is not, yet).
    watched: bool,
}

impl Subscription {
    /// Completes at the next change after the last one this saw (or after registration).
    pub(crate) async fn changed(&mut self) {
        if !self.watched {
            // An early observer: this process's changes only, until the hub is old enough.
            tokio::select! {
                changed = self.rx.changed() => {
                    let _ = changed;
                    return;
                }
                () = tokio::time::sleep_until(self.hub.born + OBSERVERS_EARLY) => {}
            }
            let mut files = self.hub.files();
            files.release_listeners += 1;
            self.watched = true;
            self.hub.need(&mut files, CLOSES);
        }
        // An error means the hub is gone: nothing will change any more, so wake up.
        let _ = self.rx.changed().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if !self.watched {
            return;
        }
        let mut files = self.hub.files();
        let left = if self.names {
            files.name_listeners -= 1;
            files.name_listeners
        } else {
            files.release_listeners -= 1;
            files.release_listeners
        };
        if left == 0 {
            let want = self.hub.wanted(&files);
            self.hub.set_mask(&mut files, want);
        }
    }
}

/// For how long after a hub's start observers' subscriptions do not watch the directory (see
/// the module's documentation), as a holder's loss watcher does not for its first second.
const OBSERVERS_EARLY: Duration = Duration::from_secs(1);

/// How often the reader thread checks whether its hub is still in use.
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// A lock file closed, by anyone: the only release another process makes visible.
const CLOSES: WatchFlags = WatchFlags::CLOSE_WRITE.union(WatchFlags::CLOSE_NOWRITE);

/// A lock file's name now leads elsewhere, or nowhere; or the directory itself went.
const NAMES: WatchFlags = WatchFlags::DELETE
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::CREATE)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF);

fn registry() -> MutexGuard<'static, HashMap<PathBuf, Weak<Hub>>> {
    static HUBS: OnceLock<Mutex<HashMap<PathBuf, Weak<Hub>>>> = OnceLock::new();
    lock(HUBS.get_or_init(Default::default))
}

impl Hub {
    /// The hub of `dir`, started if no store in this process uses it yet.
    pub(crate) fn for_dir(dir: &Path) -> Arc<Hub> {
        let mut hubs = registry();
        if let Some(hub) = hubs.get(dir).and_then(Weak::upgrade) {
            return hub;
        }
        hubs.retain(|_, w| w.strong_count() > 0);
        let hub = Arc::new(Hub {
            dir: dir.to_path_buf(),
            files: Mutex::new(Files::default()),
            records: Sidecar::new(dir),
            inotify: OnceLock::new(),
            born: tokio::time::Instant::now(),
            lines: Arc::default(),
        });
        hubs.insert(dir.to_path_buf(), Arc::downgrade(&hub));
        hub
    }

    /// The inotify instance, started (with its reader thread) on first use.
    fn inotify(self: &Arc<Self>) -> Option<&Arc<OwnedFd>> {
        self.inotify
            .get_or_init(|| {
                let fd = Arc::new(start_inotify(&self.dir)?);
                let (reader, weak) = (fd.clone(), Arc::downgrade(self));
                let spawned = std::thread::Builder::new()
                    .name("xtr-lock-inotify".into())
                    .spawn(move || read_events(&reader, &weak));
                if let Err(err) = spawned {
                    tracing::warn!(target: TARGET, error = %err,
                        "cannot start the inotify thread; flock waiters will poll");
                    return None;
                }
                Some(fd)
            })
            .as_ref()
    }

    /// Whether the inotify instance was started (for tests).
    #[cfg(test)]
    pub(crate) fn inotify_started(&self) -> bool {
        self.inotify.get().is_some()
    }

    /// Whether the directory is watched for releases now (for tests).
    #[cfg(test)]
    pub(crate) fn watches_closes(&self) -> bool {
        self.files()
            .watching
            .is_some_and(|(_, mask)| mask.contains(CLOSES))
    }

    /// Whether changes made by other processes reach this hub (starting inotify if no listener
    /// did yet).
    pub(crate) fn observes_other_processes(self: &Arc<Self>) -> bool {
        self.inotify().is_some()
    }

    /// Whether changes made by other processes reach this hub, if known yet (`None`: nobody
    /// listened yet, so inotify was not started).
    pub(crate) fn observes_if_known(&self) -> Option<bool> {
        self.inotify.get().map(Option::is_some)
    }

    fn files(&self) -> MutexGuard<'_, Files> {
        lock(&self.files)
    }

    /// This process's waiters of the directory's lock files, in line.
    pub(crate) fn lines(&self) -> &Arc<Lines> {
        &self.lines
    }

    /// Wakes the waiters of `name` (and not its observers): its line moved.
    pub(crate) fn wake_waiters(&self, name: &str) {
        self.files().releases.notify(name);
    }

    /// The holders' records of this directory.
    pub(crate) fn records(&self) -> &Sidecar {
        &self.records
    }

    /// Wakes on the next release of `name` (registered now).
    pub(crate) fn subscribe(self: &Arc<Self>, name: &str) -> Subscription {
        self.subscribe_releases(name, false)
    }

    /// Wakes on the next acquisition in this process or release of `name`, for an observer
    /// (registered now; it is no waiter).
    pub(crate) fn subscribe_changes(self: &Arc<Self>, name: &str) -> Subscription {
        self.subscribe_releases(name, true)
    }

    fn subscribe_releases(self: &Arc<Self>, name: &str, observer: bool) -> Subscription {
        let mut files = self.files();
        let rx = match observer {
            true => files.changes.subscribe(name),
            false => files.releases.subscribe(name),
        };
        let watched = !observer || self.born.elapsed() >= OBSERVERS_EARLY;
        if watched {
            files.release_listeners += 1;
            self.need(&mut files, CLOSES);
        }
        Subscription {
            rx,
            hub: self.clone(),
            names: false,
            watched,
        }
    }

    /// Wakes when `name` is unlinked, renamed over or created (registered now).
    pub(crate) fn subscribe_name(self: &Arc<Self>, name: &str) -> Subscription {
        let mut files = self.files();
        let rx = files.names.subscribe(name);
        files.name_listeners += 1;
        self.need(&mut files, NAMES);
        Subscription {
            rx,
            hub: self.clone(),
            names: true,
            watched: true,
        }
    }

    /// What the directory must be watched for, for the listeners there are.
    fn wanted(&self, files: &Files) -> WatchFlags {
        let mut want = WatchFlags::empty();
        if files.release_listeners > 0 {
            want |= CLOSES;
        }
        if files.name_listeners > 0 {
            want |= NAMES;
        }
        want
    }

    /// Makes sure the directory is watched for `bits` (a listener was just registered),
    /// starting inotify for the first.
    fn need(self: &Arc<Self>, files: &mut Files, bits: WatchFlags) {
        if self.inotify().is_none() {
            return;
        }
        let have = files.watching.map_or(WatchFlags::empty(), |(_, mask)| mask);
        if !have.contains(bits) {
            self.set_mask(files, have | bits);
        }
    }

    /// Watches the directory for `want` (nothing: no watch).
    fn set_mask(&self, files: &mut Files, want: WatchFlags) {
        let Some(Some(fd)) = self.inotify.get() else {
            return;
        };
        match files.watching {
            Some((_, mask)) if mask == want => {}
            Some((wd, _)) if want.is_empty() => {
                let _ = inotify::remove_watch(fd.as_fd(), wd);
                files.watching = None;
            }
            _ if want.is_empty() => {}
            _ => match inotify::add_watch(fd.as_fd(), &self.dir, want | WatchFlags::ONLYDIR) {
                // Adding a watch again on the same directory replaces its mask.
                Ok(wd) => files.watching = Some((wd, want)),
                Err(err) => tracing::warn!(target: TARGET, error = %err,
                    dir = %self.dir.display(),
                    "cannot watch the lock directory; flock falls back to polling"),
            },
        }
    }

    /// Drops the channels nobody listens to (the watch itself follows the listeners).
    fn sweep_idle(&self) {
        let mut files = self.files();
        files.releases.retain_listened();
        files.names.retain_listened();
        files.changes.retain_listened();
    }

    /// Wakes the waiters of `name` (and of its semaphore, for a slot file).
    pub(crate) fn notify(&self, name: &str) {
        let mut files = self.files();
        files.releases.notify(name);
        files.changes.notify(name);
        if let Some(channel) = slot_channel(name) {
            files.releases.notify(&channel);
            files.changes.notify(&channel);
        }
    }

    /// Wakes the observers of `name` (a lock file or a semaphore's channel): taken here.
    pub(crate) fn acquired(&self, name: &str) {
        self.files().changes.notify(name);
    }

    fn name_changed(&self, name: &str) {
        let mut files = self.files();
        files.names.notify(name);
        if let Some(channel) = slot_channel(name) {
            files.names.notify(&channel);
        }
    }

    /// Wakes everyone (the kernel dropped events, or the directory went).
    fn notify_all(&self) {
        let files = self.files();
        files.releases.notify_all();
        files.names.notify_all();
        files.changes.notify_all();
    }

    /// The kernel dropped watch `wd`: whether it was the current one (the directory went away).
    fn forget_watch(&self, wd: i32) -> bool {
        let mut files = self.files();
        let current = files.watching.is_some_and(|(w, _)| w == wd);
        if current {
            files.watching = None;
        }
        current
    }
}

fn start_inotify(dir: &Path) -> Option<OwnedFd> {
    // Checked once now, so a directory inotify cannot watch says so at its first listener.
    let started = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
        .and_then(|fd| {
            let wd = inotify::add_watch(&fd, dir, CLOSES | WatchFlags::ONLYDIR)?;
            inotify::remove_watch(&fd, wd)?;
            Ok(fd)
        });
    match started {
        Ok(fd) => Some(fd),
        Err(err) => {
            tracing::warn!(target: TARGET, error = %err, dir = %dir.display(),
                "cannot watch the lock directory with inotify; flock waiters will poll");
            None
        }
    }
}

fn read_events(fd: &OwnedFd, hub: &Weak<Hub>) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
    let timeout = Timespec::try_from(IDLE_CHECK).expect("a small duration fits a timespec");
    loop {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        let ready = rustix::event::poll(&mut fds, Some(&timeout));
        let Some(hub) = hub.upgrade() else {
            return; // no store uses this directory any more
        };
        match ready {
            Ok(0) => {
                hub.sweep_idle();
                continue;
            }
            Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(target: TARGET, error = %err,
                    "inotify poll failed; flock waiters fall back to polling");
                return;
            }
        }
        let mut reader = inotify::Reader::new(fd.as_fd(), &mut buf);
        loop {
            match reader.next() {
                Ok(event) => dispatch(&hub, &event),
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => break,
                Err(err) => {
                    tracing::warn!(target: TARGET, error = %err,
                        "reading inotify events failed; flock waiters fall back to polling");
                    return;
                }
            }
        }
    }
}

fn dispatch(hub: &Hub, event: &inotify::Event<'_>) {
    let flags = event.events();
    if flags.contains(ReadFlags::QUEUE_OVERFLOW)
        || flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF)
    {
        hub.notify_all();
    }
    if flags.contains(ReadFlags::IGNORED) {
        // Only the current watch's end matters (the directory went): the end of one removed
        // on purpose, or of the check made at start, would wake observers with nothing changed.
        if hub.forget_watch(event.wd()) {
            hub.notify_all();
        }
        return;
    }
    let Some(name) = event.file_name().and_then(|n| n.to_str().ok()) else {
        return;
    };
    if flags.intersects(ReadFlags::CLOSE_WRITE | ReadFlags::CLOSE_NOWRITE) {
        hub.notify(name);
    }
    if flags.intersects(
        ReadFlags::DELETE | ReadFlags::MOVED_FROM | ReadFlags::MOVED_TO | ReadFlags::CREATE,
    ) {
        hub.name_changed(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_covers_what_listeners_need_and_goes_when_they_do() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::for_dir(dir.path());
        assert!(
            hub.observes_other_processes(),
            "this test needs inotify on the temporary directory"
        );
        let mask = |hub: &Hub| hub.files().watching.map(|(_, m)| m);
        assert_eq!(mask(&hub), None, "nobody listens: no watch");
        let name_rx = hub.subscribe_name("a");
        assert_eq!(
            mask(&hub),
            Some(NAMES),
            "loss watchers need name events only"
        );
        let release_rx = hub.subscribe("a");
        let other_rx = hub.subscribe("b");
        assert_eq!(mask(&hub), Some(NAMES | CLOSES));
        drop(release_rx);
        assert_eq!(mask(&hub), Some(NAMES | CLOSES), "a waiter is left");
        drop(other_rx);
        // At once, not when the directory next goes quiet: a busy directory would keep paying
        // for close events nobody waits for.
        assert_eq!(mask(&hub), Some(NAMES), "no waiter: close events go");
        drop(name_rx);
        assert_eq!(mask(&hub), None, "nobody listens: the watch goes");
    }
}

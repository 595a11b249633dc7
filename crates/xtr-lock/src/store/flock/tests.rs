//! Unit tests of the flock store's waiting schedule.

use super::*;

#[test]
fn without_close_events_waiters_back_off_like_the_python_peer() {
    let ms = |x: f64| Duration::from_secs_f64(x / 1000.0);
    let bounds = [
        (10.0, 11.0),
        (20.0, 22.0),
        (40.0, 44.0),
        (80.0, 88.0),
        (100.0, 110.0),
        (100.0, 110.0),
    ];
    for _ in 0..200 {
        for (tries, (lo, hi)) in bounds.iter().enumerate() {
            let d = backoff(false, DEFAULT_POLL, tries as u32);
            assert!(d >= ms(*lo) && d <= ms(*hi), "try {tries}: {d:?}");
        }
    }
}

#[test]
fn with_close_events_the_poll_is_only_a_safety_net() {
    for tries in 0..10 {
        let d = backoff(true, DEFAULT_POLL, tries);
        assert!(
            d >= Duration::from_millis(90) && d <= Duration::from_millis(110),
            "{d:?}"
        );
    }
}

//! Work that mostly waits (a connection's round trips, a node's transfer), fanned out on
//! scoped threads so that the pieces wait together rather than one after another.

/// `f` of each of `items`, each on its own thread, all at once; the results in the items'
/// order. A thread that panicked gives `lost()` in its place.
pub fn at_once<T: Send, R: Send>(
    items: impl IntoIterator<Item = T>,
    f: impl Fn(T) -> R + Sync,
    lost: impl Fn() -> R,
) -> Vec<R> {
    let f = &f;
    std::thread::scope(|scope| {
        let threads: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || f(item)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| lost()))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_in_the_items_order_and_a_panic_gives_the_stand_in() {
        let got = at_once(
            [3u64, 0, 1],
            |ms| {
                assert!(ms > 0, "a thread that panics");
                std::thread::sleep(std::time::Duration::from_millis(ms * 10));
                ms * 2
            },
            || 99,
        );
        assert_eq!(got, [6, 99, 2]);
    }
}

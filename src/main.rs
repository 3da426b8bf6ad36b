//! The `braid` binary: everything lives in the library; this only hands over the exit code.

/// mimalloc rather than glibc's malloc: with several TLS connections on their own threads,
/// glibc gives each thread an arena and returns freed record buffers to the kernel, so the
/// same pages are faulted in again and again; that cost about as much CPU as the decryption.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    braid::cli::main()
}

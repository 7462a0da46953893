//! The child process of the fault tests and the adversity suite (see
//! `fencelock_integration::holder`).

#[tokio::main]
async fn main() {
    fencelock_integration::holder::run(std::env::args()).await;
}

//! WebHDFS client, Hadoop configuration discovery and input splits (work in progress).

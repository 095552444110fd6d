package io.mqbalance.rocketmq;

/** A sidecar request failed: {@link #status()} is the HTTP status, or 0 when the sidecar was unreachable. */
public class SidecarException extends Exception {
    private static final long serialVersionUID = 1L;
    private final int status;

    public SidecarException(int status, String message, Throwable cause) {
        super(message, cause);
        this.status = status;
    }

    public int status() {
        return status;
    }
}

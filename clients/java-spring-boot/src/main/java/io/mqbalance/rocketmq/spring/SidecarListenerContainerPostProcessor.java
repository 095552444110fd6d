package io.mqbalance.rocketmq.spring;

import org.apache.rocketmq.spring.support.DefaultRocketMQListenerContainer;
import org.springframework.beans.BeansException;
import org.springframework.beans.factory.BeanFactory;
import org.springframework.beans.factory.BeanFactoryAware;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.config.BeanPostProcessor;
import org.springframework.beans.factory.config.ConfigurableBeanFactory;

/**
 * Puts every {@code @RocketMQMessageListener} container through the sidecar.
 *
 * <p>rocketmq-spring registers one {@link DefaultRocketMQListenerContainer} bean per listener; its
 * {@code afterPropertiesSet} makes the {@code DefaultMQPushConsumer}, subscribes it and registers
 * the concurrent or orderly listener, and Spring's lifecycle starts it later. After that
 * initialisation, and before the start, is exactly where {@code SidecarPushConsumer.install} goes:
 * this post-processor installs it there (the allocation strategy, the long-poll, the offset store
 * and the wrapped listener), for every container, with no change to the application's listener
 * classes. (rocketmq-spring's own hook, {@code RocketMQPushConsumerLifecycleListener.prepareStart},
 * would need every listener class to implement it.)
 */
public class SidecarListenerContainerPostProcessor implements BeanPostProcessor, BeanFactoryAware {
    private final ObjectProvider<SidecarListenerContainers> containers;
    private ConfigurableBeanFactory beanFactory;

    public SidecarListenerContainerPostProcessor(ObjectProvider<SidecarListenerContainers> containers) {
        this.containers = containers;
    }

    @Override
    public void setBeanFactory(BeanFactory beanFactory) throws BeansException {
        this.beanFactory = beanFactory instanceof ConfigurableBeanFactory ? (ConfigurableBeanFactory) beanFactory : null;
    }

    @Override
    public Object postProcessAfterInitialization(Object bean, String beanName) throws BeansException {
        if (bean instanceof DefaultRocketMQListenerContainer) {
            SidecarListenerContainers registry = containers.getObject();
            if (registry.install(beanName, (DefaultRocketMQListenerContainer) bean) != null && beanFactory != null) {
                // The registry depends on the container: Spring stops (and destroys) a bean's
                // dependents before the bean, so the registry hands the queues over before the
                // container's own stop() shuts its consumer down.
                beanFactory.registerDependentBean(beanName, SidecarListenerContainers.BEAN_NAME);
            }
        }
        return bean;
    }
}
